"""The sampler during real training runs, block-device resolution, per-step figures and the report.

NVML is absent on this machine: GPU fields are faked behind the sampler's `GpuReader` interface only."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import statistics
import time
from pathlib import Path

import psutil
import pytest
import torch
from rich.console import Console

from conftest import cli, copy_store, flat, h200_budget_run_with_its_plan, write_spec
from offloadlab.results.steps import PHASES, SWAP_EVENT, CumulativeSeries, SampledSeries
from offloadlab.results.store import DB_NAME, RunStore, StepRecord
from offloadlab.results.summary import summarize
from offloadlab.results.tables import compare_table
from offloadlab.spec import ModelSpec
from offloadlab.telemetry.block_devices import read_diskstats, resolve_block_devices
from offloadlab.telemetry.sampler import GPU_FIELDS, NvmlReader, Sampler, SamplerProcess
from offloadlab.workload.model import build_model

SWAPPING = [
    # small-cpu's matrices are over DeepSpeed's 1 MiB swap threshold, so they really go to the drive.
    dict(
        name="zero3-nvme",
        engine="deepspeed",
        zero_stage=3,
        offload_optimizer="nvme",
        offload_param="nvme",
        buffer_count=8,
        buffer_size=2_000_000,
    ),
    dict(name="fsdp2-cpu-offload", engine="fsdp2", cpu_offload=True),
]


@pytest.fixture(scope="module")
def swapping_run(tmp_path_factory, nvme_root) -> Path:
    folder = tmp_path_factory.mktemp("swapping")
    spec = write_spec(
        folder,
        SWAPPING,
        nvme_path=str(nvme_root),
        model=dict(preset="small-cpu"),
        seq_len=64,
        steps=4,
        telemetry_hz=20,
    )
    cli("run", str(spec), "--out", str(folder / "run"))
    return folder / "run"


def _ids(store: RunStore) -> dict[str, int]:
    return {row["name"]: row["id"] for row in store.strategies(store.run()["id"])}


def test_host_and_disk_are_sampled_while_training(swapping_run):
    store = RunStore(swapping_run)
    for name, strategy_id in _ids(store).items():
        rss = [v for _, _, v in store.samples(strategy_id, "host.rss_tree(B)")]
        assert len(rss) >= 5 and min(rss) > 50 * 2**20, name
        assert store.samples(strategy_id, "disk.write(B/s)"), name
        assert not store.samples(strategy_id, "gpu%"), "no GPU here: no GPU rows"
        notes = [e["detail"] for e in store.events(strategy_id, "telemetry_note")]
        assert len(notes) == 1 and notes[0].startswith("GPU fields absent: NVML unavailable")


def test_nvme_swapping_moves_the_disk_counters_and_fsdp_offload_does_not(swapping_run):
    summaries = {s.name: s for s in summarize(RunStore(swapping_run))}
    nvme, cpu = summaries["zero3-nvme"], summaries["fsdp2-cpu-offload"]
    assert nvme.status == "done" and nvme.checkpoint_verified, nvme.checkpoint_detail
    # small-cpu in fp32: its ~80 MB of optimizer state crosses the drive each step (the parameters stay in RAM).
    assert nvme.disk_read_bytes_per_step > 10 * 2**20
    assert nvme.disk_write_bytes_per_step > 10 * 2**20
    assert nvme.device_write_bytes_per_step > 5 * 2**20
    assert cpu.disk_read_bytes_per_step == 0 and cpu.disk_write_bytes_per_step == 0
    # What DeepSpeed put on NVMe, counted on its own objects: the one optimizer sub-group; the parameters
    # fit its max_in_cpu buffer (1e9 elements), which it fills first and keeps in RAM.
    assert nvme.tensors_on_nvme == (0, 1) and not nvme.swapped_nothing
    assert cpu.tensors_on_nvme is None and not cpu.swapped_nothing
    assert "swapped nothing" not in cli("compare", str(swapping_run)).stdout
    # Pinned: 8 fp32 parameter buffers of buffer_size, and 4 fp32 optimizer buffers of the one sub-group
    # (the whole model here), each rounded up to the aio alignment.
    n_params = sum(p.numel() for p in build_model(ModelSpec(preset="small-cpu"), seq_len=64, seed=0).parameters())
    expected = 8 * 2_000_000 * 4 + 4 * n_params * 4
    assert expected <= nvme.pinned_swap_bytes < 1.01 * expected
    assert cpu.pinned_swap_bytes == 0


def test_the_wait_for_nvme_swaps_is_measured_and_split_by_phase(swapping_run):
    """The swap meter sees every byte the drive moved for the strategy, and how long each phase waited."""
    from tui.widgets import capacity_line, phase_bar

    store = RunStore(swapping_run)
    strategy_id = _ids(store)["zero3-nvme"]
    # The step re-run after the checkpoint's restore carries its number again: the training steps only.
    events = [(e["step"], json.loads(e["detail"])) for e in store.events(strategy_id, SWAP_EVENT)]
    swaps = {step: detail for step, detail in events if detail["phase"] == "train"}
    steps = [r for r in store.steps(strategy_id) if r.phase == "train"]
    assert sorted(swaps) == [r.step for r in steps]
    for step in steps[1:]:  # the first step swaps the states in for the first time
        # Independent counts: the buffers submitted to aio, and the block layer's bytes for the worker.
        assert swaps[step.step]["read_bytes"] == pytest.approx(step.disk_read_bytes, rel=0.01)
        assert swaps[step.step]["write_bytes"] == pytest.approx(step.disk_write_bytes, rel=0.01)
    summaries = {s.name: s for s in summarize(store)}
    nvme, cpu = summaries["zero3-nvme"], summaries["fsdp2-cpu-offload"]
    # The optimizer swaps the states of its one sub-group in and out; every wait falls inside a phase.
    assert nvme.nvme_wait_seconds["optimizer"] > 0 and nvme.nvme_wait_seconds["other"] < 1e-3
    for phase in PHASES:
        assert nvme.nvme_wait_seconds[phase] <= nvme.phase_seconds[phase]
    assert 0 < nvme.nvme_wait_share < 1
    assert cpu.nvme_wait_seconds is None and cpu.nvme_wait_share is None
    assert "░" in phase_bar(nvme).plain and "░" not in phase_bar(cpu).plain
    assert f"NVMe wait ░ {nvme.nvme_wait_share:.0%} of the step" in capacity_line(nvme).plain


def test_the_swap_meter_counts_a_real_aio_handles_bytes_and_waits(tmp_path, monkeypatch):
    from offloadlab.engines.ops import load_op
    from offloadlab.train.swap_meter import MeteredHandle, SwapMeter

    aio = load_op("async_io")
    monkeypatch.setattr(aio, "aio_handle", aio.aio_handle)  # put back after the test
    monkeypatch.setattr(SwapMeter, "_installed", None)
    meter = SwapMeter.install()
    handle = aio.aio_handle(1 << 20, 8, False, True, 1)
    assert isinstance(handle, MeteredHandle)
    written = torch.arange(1 << 20, dtype=torch.float32)
    assert handle.async_pwrite(written, str(tmp_path / "swap"), 0) == 0
    assert handle.wait() == 1
    read = torch.zeros_like(written)
    assert handle.async_pread(read, str(tmp_path / "swap"), 0) == 0
    assert handle.wait() == 1 and torch.equal(read, written)
    totals = meter.drain()
    assert (totals.read_bytes, totals.write_bytes, len(totals.wait_spans)) == (4 << 20, 4 << 20, 2)
    # A wait counts inside a phase for the part of it that overlaps the phase's span.
    first_start, first_end = totals.wait_spans[0]
    middle = (first_start + first_end) / 2
    by_phase = totals.wait_by_phase([("optimizer", middle, totals.wait_spans[1][1] + 1.0)])
    assert by_phase["optimizer"] == pytest.approx(totals.wait_seconds - (middle - first_start))
    assert meter.drain().wait_spans == []


def test_step_events_share_the_samples_clock(swapping_run):
    store = RunStore(swapping_run)
    strategy_id = _ids(store)["zero3-nvme"]
    steps = store.steps(strategy_id)
    times = [t for t, _, _ in store.samples(strategy_id, "host.cpu(%)")]
    assert times[0] < steps[0].t_start and steps[-1].t_end < times[-1]


class FakeGpu:
    """Stands in for NVML only: two GPUs, the second without PCIe counters, each read taking 20 ms as
    NVML's PCIe getter does."""

    def __init__(self):
        self.reads = 0

    def read(self):
        time.sleep(0.02)
        self.reads += 1
        full = {
            "util(%)": 50.0,
            "mem_used(B)": 2.0**30,
            "pcie_tx(B/s)": 5e9,
            "pcie_rx(B/s)": 6e9,
            "power(W)": 300.0,
            "temp(C)": 60.0,
        }
        return [full, {**full, "pcie_tx(B/s)": None, "pcie_rx(B/s)": None}]


def _store_with_strategy(tmp_path: Path) -> int:
    store = RunStore(tmp_path, create_schema=True)
    run_id = store.add_run("t", "")
    return store.add_strategy(run_id, "s", "fsdp2", {}, 1)


def test_gpu_fields_are_recorded_per_gpu_and_a_missing_field_stays_absent(tmp_path):
    strategy_id = _store_with_strategy(tmp_path)
    gpu = FakeGpu()
    with Sampler(tmp_path, strategy_id, hz=20, nvme_path=tmp_path, gpu_reader=gpu, flush_every_s=0.1):
        deadline = time.time() + 30  # a loaded machine gives the sampler's thread fewer turns in a fixed time
        while gpu.reads < 5 and time.time() < deadline:
            time.sleep(0.05)
    store = RunStore(tmp_path)
    assert gpu.reads >= 5
    for field in GPU_FIELDS:
        assert len(store.samples(strategy_id, f"gpu0.{field}")) == gpu.reads
    assert {v for _, _, v in store.samples(strategy_id, "gpu1.pcie_tx(B/s)")} == {None}
    assert {v for _, _, v in store.samples(strategy_id, "gpu0.pcie_rx(B/s)")} == {6e9}


def test_without_nvml_the_reader_says_why_once():
    reader, note = NvmlReader.open()
    assert reader is None and note.startswith("GPU fields absent")


def test_the_path_resolves_to_the_block_device_diskstats_counts():
    devices = resolve_block_devices(Path(__file__))
    assert devices is not None and devices.primary in read_diskstats()


def test_partitions_and_raid_members_resolve(tmp_path):
    """A sysfs tree laid out as the kernel does: md0 over two partitions of two NVMe drives."""
    devices = tmp_path / "devices"
    for disk in ("nvme0n1", "nvme1n1"):
        (devices / disk / f"{disk}p1").mkdir(parents=True)
        (devices / disk / f"{disk}p1" / "partition").write_text("1")
    md = devices / "virtual" / "md0"
    (md / "slaves").mkdir(parents=True)
    (md / "slaves" / "nvme0n1p1").symlink_to(devices / "nvme0n1" / "nvme0n1p1")
    (md / "slaves" / "nvme1n1p1").symlink_to(devices / "nvme1n1" / "nvme1n1p1")
    sys_block = tmp_path / "dev-block"
    sys_block.mkdir()
    st = os.stat(tmp_path)
    (sys_block / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}").symlink_to(md)
    resolved = resolve_block_devices(tmp_path, sys_block)
    assert resolved.primary == "md0"
    assert resolved.members == ("nvme0n1", "nvme0n1p1", "nvme1n1", "nvme1n1p1")


def test_cumulative_series_interpolates_between_samples():
    series = CumulativeSeries([(0.0, "m", 0.0), (1.0, "m", 100.0), (2.0, "m", 50.0)])
    assert series.between(0.5, 1.5) == pytest.approx(50 + 25)
    assert series.between(-1, 3) == pytest.approx(150)
    assert CumulativeSeries([]).between(0, 1) is None


def test_a_steps_mean_sample_is_the_mean_of_its_window_or_the_nearest_sample():
    rows = [(0.1 * i, "gpu0.util(%)", float(i % 7) if i % 5 else None) for i in range(200)]
    series = SampledSeries(rows)
    for start, end in [(1.0, 2.0), (3.05, 3.95), (0.0, 19.9), (5.01, 5.02), (-3.0, -2.0), (30.0, 31.0)]:
        inside = [v for t, _, v in rows if start <= t <= end and v is not None]
        if inside:
            assert series.mean_in(start, end) == pytest.approx(sum(inside) / len(inside))
        else:  # shorter than a sampling period: the sample nearest the step's middle
            nearest = min(rows, key=lambda r: abs(r[0] - (start + end) / 2))
            assert series.mean_in(start, end) == nearest[2]
    assert SampledSeries([]).mean_in(0.0, 1.0) is None


def test_report_has_a_chart_per_strategy_and_metric(swapping_run, tmp_path):
    out = cli("report", str(swapping_run), "--png", str(tmp_path / "charts")).stdout
    page = (swapping_run / "report.html").read_text()
    assert "report.html" in out and "<script" not in page  # self-contained: nothing runs, nothing is fetched
    # The three metric charts with samples (no GPU here: its three are left out and named), where the step
    # goes, loss and step time: each one matplotlib SVG.
    assert page.count("<svg") == 3 + 3
    assert "no samples of: GPU memory used, PCIe, GPU utilization" in page
    # --png: the same six charts as images (for slides and the docs' screenshots), named by their titles.
    pngs = sorted((tmp_path / "charts").iterdir())
    assert "charts: 6 PNG files" in flat(out) and len(pngs) == 6
    assert {"where-the-step-goes.png", "loss-per-step.png", "step-time.png", "host-rss-process-tree.png"} <= {
        p.name for p in pngs
    }
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000 for p in pngs)
    refused = cli("report", str(swapping_run), "--png", str(swapping_run / "report.html"), check=False)
    assert refused.returncode == 2 and "is a file: pass a folder" in refused.stderr
    (tmp_path / "no-run").mkdir()  # not a run: refused before --png's folders are made
    refused = cli("report", str(tmp_path / "no-run"), "--png", str(tmp_path / "made" / "charts"), check=False)
    assert refused.returncode == 2 and "not an offloadlab run directory (pass a run's folder" in refused.stderr
    assert not (tmp_path / "made").exists()
    refused = cli("compare", str(tmp_path / "missing"), check=False)  # a typo: said "holds no offloadlab.sqlite"
    assert refused.returncode == 2 and "missing does not exist: pass a run's folder" in refused.stderr
    refused = cli("compare", str(swapping_run / DB_NAME), check=False)  # said "... holds no offloadlab.sqlite"
    assert refused.returncode == 2 and f"is a file: pass the run's folder, {swapping_run}" in refused.stderr
    # compare's table with every column, statuses in words, the checkpoints verified
    for header in ("bound by", "of GPU/RAM", "comm/step", "SSD writes", "PCIe GB/s", "checkpoint"):
        assert header in page, header
    assert page.count("<td>done</td>") == 2 and page.count("<td>verified</td>") == 2
    # Legends name the strategies (loss) and each strategy's lines (read / write on one axes); host RSS
    # is drawn on the machine's RAM, named beside it as above the scale (a line there flattened the RSS).
    for label in ("zero3-nvme", "fsdp2-cpu-offload", "zero3-nvme: read", "fsdp2-cpu-offload: write", "optimizer",
                  "NVMe wait"):  # fmt: skip
        assert f">{label}</text>" in page, label  # text drawn as text
    # Each row names its stall line: drawn, or (no step near it set the shared scale that high) named above.
    assert page.count(">stall line</text>") + len(re.findall(r">stall line [0-9.]+ s, above</text>", page)) == 2
    ram = summarize(RunStore(swapping_run))[0].host_memory_bytes / 2**30
    assert f">RAM {ram:.3g} GiB, above the scale</text>" in page


def test_the_report_draws_the_budget_the_link_and_the_plan_of_an_h200_run(tmp_path):
    """Session 12's H200 run held to 24 GiB, with its plan attached: GPU memory is drawn against the budget,
    PCIe against the link the plan measured, and the table holds each step against the plan's."""
    run_dir, planned = h200_budget_run_with_its_plan(tmp_path)
    cli("report", str(run_dir))
    page = (run_dir / "report.html").read_text()
    for label in ("budget", "link to GPU (plan)", "link to host (plan)", "step/plan"):
        assert label in page, label
    s = next(s for s in summarize(RunStore(run_dir)) if s.name == "zero3-opt-cpu")
    assert f"{s.mean_step_time_s / planned['zero3-opt-cpu'].step_s:.2f}x" in page


@pytest.mark.slow
def test_the_side_process_sampler_records_and_leaves_itself_out_of_the_rss(tmp_path):
    """What `offloadlab run` uses: the loop in a child process, stopped by closing its stdin."""
    strategy_id = _store_with_strategy(tmp_path)
    with SamplerProcess(tmp_path, strategy_id, hz=20, nvme_path=tmp_path) as sampler:
        time.sleep(1.5)
        own_rss = psutil.Process().memory_info().rss
    assert sampler.proc.returncode == 0
    store = RunStore(tmp_path)
    rss = [v for _, _, v in store.samples(strategy_id, "host.rss_tree(B)")]
    assert len(rss) >= 10
    # The tree is this process (the root) alone: the sampler's own ~30 MB interpreter is not counted.
    assert statistics.median(rss) == pytest.approx(own_rss, rel=0.02)
    assert store.events(strategy_id, "telemetry_note")  # NVML is absent here, said once
    assert len(store.events(strategy_id, "telemetry_note")) == 1


@pytest.mark.slow
def test_the_side_process_sampler_flushes_on_sigterm(tmp_path):
    """A run stopped with Ctrl-C sends SIGTERM to the job's process group, the sampler included."""
    strategy_id = _store_with_strategy(tmp_path)
    with SamplerProcess(tmp_path, strategy_id, hz=20, nvme_path=tmp_path) as sampler:
        time.sleep(1.0)
        sampler.proc.send_signal(signal.SIGTERM)
        sampler.proc.wait(timeout=10)
    assert sampler.proc.returncode == 0
    assert len(RunStore(tmp_path).samples(strategy_id, "host.cpu(%)")) >= 5


def test_steps_after_one_already_read_are_the_new_ones_only(tmp_path):
    """What `run` prints a line for on each poll, without re-reading a long run's steps."""
    strategy_id = _store_with_strategy(tmp_path)
    store = RunStore(tmp_path, writable=True)
    for step in range(1, 6):
        store.add_step(
            strategy_id, 0, StepRecord(step, 5.0 - step / 10, step, step + 0.5, 100.0, None, None, None, 1, 0, 0)
        )
    store.add_step(strategy_id, 0, StepRecord(4, 4.6, 9, 9.5, 100.0, None, None, None, 1, 0, 0, phase="restored"))
    assert [r.step for r in store.steps(strategy_id, after_step=3)] == [4, 5]
    assert [r.step for r in store.steps(strategy_id)] == [1, 2, 3, 4, 5]
    assert store.steps(strategy_id, after_step=5) == []


def test_compare_holds_nvme_traffic_against_the_rates_the_tune_measured(swapping_run, tmp_path):
    """A strategy run with a tune's fragment carries the drive's measured rates; compare (from 200 columns,
    and its JSON) says what share of them each step's NVMe traffic used. Here the real swapping run's zero3-nvme
    is given the rates a tune would have recorded."""
    run_dir = copy_store(swapping_run, tmp_path / "run")
    with sqlite3.connect(run_dir / DB_NAME) as conn:
        (config,) = conn.execute("SELECT config_json FROM strategies WHERE name = 'zero3-nvme'").fetchone()
        conn.execute(
            "UPDATE strategies SET config_json = ? WHERE name = 'zero3-nvme'",
            (json.dumps({**json.loads(config), "tuned_drive_gbps": [0.5, 0.25]}),),
        )
    rows = {r["name"]: r for r in json.loads(cli("compare", str(run_dir), "--json").stdout)}
    nvme = rows["zero3-nvme"]
    read, write = (nvme[f"disk_{k}_bytes_per_step"] / nvme["median_step_time_s"] / 1e9 for k in ("read", "write"))
    assert nvme["nvme_gbps"] == pytest.approx([read, write]) and nvme["tuned_drive_gbps"] == [0.5, 0.25]
    assert rows["fsdp2-cpu-offload"]["nvme_gbps"] is None  # nothing on the drive
    console = Console(width=240, record=True)  # the 200-column layout (a pipe lays out for 180 at most)
    console.print(compare_table(run_dir, summarize(RunStore(run_dir)), 200))
    table = console.export_text()
    assert f"{read:.2f} / {write:.2f}" in table and f"{read / 0.5:.0%} / {write / 0.25:.0%}" in table
