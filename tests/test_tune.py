"""`offloadlab tune`: real aio reads and writes through DeepSpeed's handle under a temp dir."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from deepspeed.runtime.swap_tensor.aio_config import get_aio_config

from conftest import cli, start_cli, write_spec
from offloadlab.checks.host import PreflightError, check_aio_contexts, check_pinned_memory
from offloadlab.engines.deepspeed.buffers import (
    max_params_in_window,
    pinned_swap_bytes,
    swap_buffer_bytes,
    swapped_numels,
    tuned_buffers,
)
from offloadlab.engines.deepspeed.config import deepspeed_config
from offloadlab.measure.aio_bench import DEEPSPEED_DEFAULT, check_io_size
from offloadlab.plan.accounting import Placement, shape_of_spec
from offloadlab.spec import AioSettings, load_spec
from offloadlab.tune.search import WORK_PREFIX, Tuner, TuneSettings, mixed_score, neighbours

NVME_STRATEGY = dict(
    name="z3", engine="deepspeed", zero_stage=3, offload_optimizer="nvme", offload_param="nvme", buffer_size=1_000_000
)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[Path, Path, dict]:
    """One real quick sweep through the CLI, with the swap buffers sized for a spec."""
    nvme = tmp_path_factory.mktemp("drive")
    (nvme / "users-file.bin").write_bytes(b"keep me")
    out = tmp_path_factory.mktemp("tune-out")
    spec = write_spec(out, [NVME_STRATEGY], nvme_path=str(nvme))
    proc = cli("tune", "--nvme", str(nvme), "--quick", "--out", str(out / "result"), "--spec", str(spec), "--json")
    return nvme, out / "result", json.loads(proc.stdout)


def test_sweep_measures_points_and_finds_one_at_least_as_good_as_the_default(tuned):
    _, _, result = tuned
    points = result["points"]
    assert len(points) >= 37  # the coarse grid (36) and the default, then refinement
    assert all(p["read_gbps"] > 0 and p["write_gbps"] > 0 for p in points)
    best = next(p for p in points if p["is_best"])
    default = next(p for p in points if p["is_deepspeed_default"])
    assert best["score_gbps"] >= default["score_gbps"]
    assert best["score_gbps"] == max(p["score_gbps"] for p in points)
    assert default["repeats"] >= 2 and best["repeats"] >= 2
    assert result["seconds"] < 60


def test_only_the_tools_own_files_were_made_and_they_are_gone(tuned):
    nvme, _, _ = tuned
    assert [p.name for p in nvme.iterdir()] == ["users-file.bin"]
    assert (nvme / "users-file.bin").read_bytes() == b"keep me"


def test_deepspeed_reads_the_emitted_json_as_chosen(tuned):
    _, out, result = tuned
    emitted = json.loads((out / "tuned_deepspeed.json").read_text())
    parsed = get_aio_config(emitted)
    for key, value in result["best"].items():
        assert parsed[key] == value, key
    assert isinstance(parsed["single_submit"], bool) and isinstance(parsed["overlap_events"], bool)
    # ds_nvme_tune's key: DeepSpeed ignores it and keeps one thread.
    assert get_aio_config({"aio": {"num_threads": 8}})["intra_op_parallelism"] == 1


def test_a_run_spec_including_the_fragment_hands_deepspeed_the_tuned_values(tuned, tmp_path):
    nvme, out, result = tuned
    strategy = {k: v for k, v in NVME_STRATEGY.items() if k != "buffer_size"}
    spec_path = write_spec(
        tmp_path, [strategy | {"tuned": str(out / "tuned.toml"), "buffer_count": 7}], nvme_path=str(nvme)
    )
    spec = load_spec(spec_path)
    config = deepspeed_config(spec, spec.strategy[0], world_size=1, nvme_dir=nvme)
    parsed = get_aio_config(config)
    assert parsed["intra_op_parallelism"] == result["best"]["intra_op_parallelism"]
    assert parsed["block_size"] == result["best"]["block_size"]
    # The fragment sized the buffers; a key the strategy sets itself wins.
    assert config["zero_optimization"]["offload_param"]["buffer_size"] == 16384
    assert config["zero_optimization"]["offload_param"]["buffer_count"] == 7
    # The drive's rates come along, for compare to hold the run's NVMe traffic against.
    assert spec.strategy[0].tuned_drive_gbps == pytest.approx((result["read_gbps"], result["write_gbps"]), abs=1e-3)


def test_tune_results_are_in_the_run_store(tuned):
    from offloadlab.results.store import RunStore

    _, out, result = tuned
    store = RunStore(out)
    rows = store.tune_points(store.run()["id"])
    assert len(rows) == len(result["points"])
    assert rows[0].is_best


def test_an_error_mid_sweep_removes_the_work_folder(tmp_path):
    calls = []

    def explode(stage, point, done, total):
        calls.append(done)
        assert list(tmp_path.glob(f"{WORK_PREFIX}*")), "the sweep's files should exist while it runs"
        if done == 3:
            raise RuntimeError("injected failure")

    with pytest.raises(RuntimeError, match="injected failure"):
        Tuner(tmp_path, "both", TuneSettings.for_mode(quick=True), explode).run()
    assert calls == [1, 2, 3]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_sweep_removes_the_work_folder(tmp_path, sig):
    proc = start_cli("tune", "--nvme", str(tmp_path), "--out", str(tmp_path / "out"))
    deadline = time.time() + 120
    # Measured points reach the run store while the sweep goes on (the TUI's tune screen follows them).
    while not (list(tmp_path.glob(f"{WORK_PREFIX}*/aio-probe.bin")) and _tune_points_stored(tmp_path / "out")):
        assert time.time() < deadline and proc.poll() is None, (
            proc.stdout.read() if proc.poll() is not None else "timeout"
        )
        time.sleep(0.05)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "the tuning files and what the tune wrote to its output folder were removed" in out
    assert not list(tmp_path.glob(f"{WORK_PREFIX}*"))
    assert not (tmp_path / "out").exists()


def _tune_points_stored(out: Path) -> int:
    import sqlite3

    try:
        with sqlite3.connect(f"file:{out / 'offloadlab.sqlite'}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT COUNT(*) FROM tune_points").fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0


@pytest.mark.slow
def test_preflight_errors_before_any_io(tmp_path):
    proc = cli("tune", "--nvme", str(tmp_path / "missing"), "--quick", "--out", str(tmp_path / "out"), check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert not (tmp_path / "out").exists()
    proc = cli("tune", "--nvme", "/dev/shm", "--quick", check=False)
    assert proc.returncode == 2 and "no O_DIRECT" in proc.stderr
    with pytest.raises(PreflightError, match="RAM available"):
        check_pinned_memory(1 << 60)
    proc_sys = tmp_path / "proc"
    proc_sys.mkdir()
    (proc_sys / "aio-max-nr").write_text("65536\n")
    (proc_sys / "aio-nr").write_text("65000\n")
    with pytest.raises(
        PreflightError, match=r"536 aio events free, 4096 needed: raise it with 'sysctl -w fs.aio-max-nr="
    ):
        check_aio_contexts(4096, proc_sys)


def test_sizes_are_checked_before_the_handle_sees_them():
    with pytest.raises(ValueError, match="multiple of 4096 x intra_op_parallelism"):
        check_io_size(3 * 4096, AioSettings(block_size=1 << 20, queue_depth=8, intra_op_parallelism=2))


def test_objective_and_neighbourhood():
    # Half the bytes read at 1 GB/s, half written at 4 GB/s: 1.6 GB/s overall.
    assert mixed_score(1.0, 4.0, 0.5) == pytest.approx(1.6)
    near = neighbours(DEEPSPEED_DEFAULT, max_threads=8)
    default = AioSettings()
    assert default.with_(block_size=2 << 20) in near and default.with_(queue_depth=16) in near
    assert default.with_(single_submit=True) in near and default.with_(overlap_events=False) in near
    assert default.with_(intra_op_parallelism=2) in near and default.with_(block_size=512 << 10) in near
    assert all(p.intra_op_parallelism >= 1 for p in near)


def test_swap_buffers_cover_the_largest_parameter_and_the_live_window(tmp_path):
    assert max_params_in_window([5, 5, 1, 20, 1, 1], capacity=11) == 3
    assert max_params_in_window([20], capacity=11) == 1
    spec = load_spec(
        write_spec(
            tmp_path,
            [NVME_STRATEGY],
            nvme_path=str(tmp_path),
            model=dict(preset="gpt-1.4b"),
            precision="bf16",
            seq_len=1024,
        )
    )
    strategy, shape = spec.strategy[0], shape_of_spec(spec)
    buffers = tuned_buffers(spec, strategy, AioSettings())
    assert buffers.param_buffer_size >= 50304 * 2048  # the embedding
    assert buffers.stage3_max_live_parameters < strategy.stage3_max_live_parameters
    swapped = swapped_numels(shape, strategy, 1, AioSettings())
    assert len(swapped) == 24 * 4 + 3  # four matrices a block, two embeddings, the head
    pinned = swap_buffer_bytes(Placement(strategy), shape, 1, buffers)
    assert sum(pinned["parameter swap buffers"]) == buffers.param_buffer_count * buffers.param_buffer_size * 2
    # One fp32 buffer per optimizer_buffer_count, each the largest sub-group (the whole 1.42B is two).
    (optimizer_buffer,) = set(pinned["optimizer swap buffers"])
    assert len(pinned["optimizer swap buffers"]) == 4 and 4e9 <= optimizer_buffer < 4.4e9
    assert pinned_swap_bytes(strategy, shape, 1, buffers) == sum(map(sum, pinned.values()))


@pytest.mark.slow
def test_verify_trains_the_tuned_buffers_and_deepspeed_pins_what_the_tune_planned(tmp_path):
    """The strategy leaves its swap buffers to the tune: the two verify steps run with them, and the pinned
    RAM DeepSpeed's swappers hold is the tune's prediction (to the 0.1 MiB shown)."""
    nvme = tmp_path / "drive"
    nvme.mkdir()
    strategy = {k: v for k, v in NVME_STRATEGY.items() if k != "buffer_size"}
    spec = write_spec(tmp_path, [strategy], nvme_path=str(nvme), model=dict(preset="small-cpu"), seq_len=64)
    proc = cli(
        "tune", "--nvme", str(nvme), "--quick", "--out", str(tmp_path / "result"), "--spec", str(spec), "--verify"
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("z3: DeepSpeed pinned"))
    pinned, planned = re.findall(r"(\d+\.\d \w+)", line)
    assert pinned == planned and pinned.endswith("MiB"), line


def test_deepspeeds_ssd_wear_warning_stays_out_of_plan_and_tune(tmp_path):
    """DeepSpeed's async_io logs a warning about consumer SSDs on its first write in a process; it landed in
    the middle of plan's and tune's tables. Each process starts fresh (the warning is once a process): the
    handle as DeepSpeed makes it warns, offloadlab's measurement does not."""
    import subprocess
    import sys

    setup = (
        "import sys, torch; from pathlib import Path; from offloadlab.engines.ops import load_op; "
        "from offloadlab.measure.aio_bench import AioBench, DEEPSPEED_DEFAULT; d = Path(sys.argv[1]); "
    )
    raw = (
        "aio = load_op('async_io'); h = aio.aio_handle(1 << 20, 8, False, True, 1); "
        "b = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.uint8)); h.sync_pwrite(b, str(d / 'raw')); "
        # Freed while the interpreter lives: left to its exit, the handle's threads once aborted it (CI, rc -6).
        "h.free_cpu_locked_tensor(b); del b, h"
    )
    ours = "bench = AioBench(d, 1 << 20); bench.measure(DEEPSPEED_DEFAULT); bench.close()"
    said = {}
    for name, code in (("raw", raw), ("ours", ours)):
        proc = subprocess.run([sys.executable, "-c", setup + code, str(tmp_path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        said[name] = "write endurance" in proc.stdout + proc.stderr
    assert said == {"raw": True, "ours": False}
