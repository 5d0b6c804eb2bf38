"""`offloadlab run` end to end: real tiny training steps through DeepSpeed (CPU accelerator) and FSDP2 (gloo)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import CTRL_C_EXIT, STRATEGIES, cli, copy_store, flat, start_cli, wait_for_worker, write_spec
from offloadlab.results.store import RunStore
from offloadlab.results.summary import summarize


def _losses(run_dir: Path) -> dict[str, list[float]]:
    store = RunStore(run_dir)
    run = store.run()
    return {row["name"]: [r.loss for r in store.steps(row["id"])] for row in store.strategies(run["id"])}


def test_every_strategy_trains_and_restores_exactly(world1):
    summaries = {s.name: s for s in summarize(RunStore(world1))}
    assert set(summaries) == {s["name"] for s in STRATEGIES}
    for s in summaries.values():
        assert s.status == "done", (s.name, s.reason)
        assert s.steps_done == 4
        assert s.checkpoint_verified is True, (s.name, s.checkpoint_detail)
        assert "loss" in s.checkpoint_detail and "state entries equal" in s.checkpoint_detail


def test_same_init_and_data_give_the_same_first_loss_in_both_engines(world1):
    losses = _losses(world1)
    first = [v[0] for v in losses.values()]
    assert max(first) - min(first) < 1e-5, losses
    # Untrained, the model is near uniform over the 256-token vocabulary: loss close to ln(256).
    assert abs(first[0] - math.log(256)) < 0.1
    for name, values in losses.items():
        assert values[-1] < values[0], f"{name} did not learn: {values}"


def test_steps_and_phase_events_are_recorded(world1):
    store = RunStore(world1)
    run = store.run()
    for row in store.strategies(run["id"]):
        steps = store.steps(row["id"])
        assert [r.step for r in steps] == [1, 2, 3, 4]
        assert all(r.t_end > r.t_start and r.tokens_per_s > 0 and r.host_rss_peak_bytes > 0 for r in steps)
        kinds = {e["kind"] for e in store.events(row["id"])}
        assert {"forward", "backward", "optimizer", "checkpoint_save"} <= kinds
        # Two micro-batches per step: two forward spans inside each step's wall time.
        step2 = steps[1]
        forwards = [e for e in store.events(row["id"], "forward") if e["step"] == 2]
        assert len(forwards) == 2
        assert all(step2.t_start <= e["t_start"] <= e["t_end"] <= step2.t_end for e in forwards)
        restored = store.steps(row["id"], phase="restored")
        assert [r.step for r in restored] == [3]


def test_nothing_is_left_under_the_nvme_path_or_in_checkpoints(world1, nvme_root):
    assert not any(p.name.startswith(f"offloadlab-{world1.name}") for p in nvme_root.iterdir())
    assert not any((world1 / "checkpoints").iterdir()) if (world1 / "checkpoints").exists() else True


def test_compare_prints_the_table_and_json(world1):
    table = cli("compare", str(world1)).stdout
    for name in ("zero2-cpu", "zero3-nvme", "fsdp2-cpu-offload", "verified", "p50 / p90", "tokens/s", "stalls"):
        assert name in table
    # The tiny GPT's optimizer sub-group is under DeepSpeed's smallest swap (1 MiB) and its parameters fit
    # max_in_cpu: its NVMe strategy moved no bytes, and compare says why rather than showing 0 B alone.
    nvme = next(s for s in summarize(RunStore(world1)) if s.name == "zero3-nvme")
    assert nvme.tensors_on_nvme == (0, 0) and not nvme.disk_write_bytes_per_step
    assert "zero3-nvme swapped nothing: DeepSpeed keeps in RAM any tensor under max(1 MiB" in flat(table)
    said = flat((world1.parent / "run.out").read_text())
    assert "zero3-nvme swapped nothing: DeepSpeed keeps in RAM" in said and "zero2-cpu swapped nothing" not in said
    rows = json.loads(cli("compare", str(world1), "--json").stdout)
    assert {r["name"] for r in rows} == {s["name"] for s in STRATEGIES}
    assert all(r["median_step_time_s"] > 0 and r["p90_step_time_s"] >= r["median_step_time_s"] for r in rows)
    # Against fsdp2, the only strategy here that offloads nothing (on a CPU offloading can be the faster).
    practicality = {r["name"]: r["practicality"] for r in rows}
    assert practicality["fsdp2"] == 1.0 and all(p > 0 for p in practicality.values())


def test_a_run_given_its_plan_holds_each_step_against_the_plans(world1):
    from rich.console import Console

    from offloadlab.results.tables import compare_table

    predicted = {x["strategy"]: x for x in json.loads((world1.parent / "plan.json").read_text())["predictions"]}
    rows = json.loads(cli("compare", str(world1), "--json").stdout)
    for r in rows:
        assert r["planned"]["step_s"] == predicted[r["name"]]["step_s"] > 0
        assert r["planned"]["gpu_bytes"] == predicted[r["name"]]["gpu_bytes"]
        assert r["step_against_plan"] == pytest.approx(r["mean_step_time_s"] / r["planned"]["step_s"])
        assert r["planned"]["pcie_link_gbps"] is None  # no GPU here: the plan measured no link
    console = Console(width=200, record=True)
    console.print(compare_table(world1, summarize(RunStore(world1)), 200))
    table = console.export_text()
    assert "step/plan" in table and f"{rows[0]['step_against_plan']:.2f}x" in table


def test_two_ranks_over_gloo_match_one_rank_with_twice_the_accumulation(world1, world2):
    one, two = _losses(world1), _losses(world2)
    summaries = {s.name: s for s in summarize(RunStore(world2))}
    for name in two:
        assert summaries[name].status == "done", summaries[name].reason
        assert summaries[name].checkpoint_verified is True, summaries[name].checkpoint_detail
        # Same samples per step, split over ranks instead of micro-batches: same losses up to reduction order.
        assert two[name] == pytest.approx(one[name], rel=1e-4), name
    store = RunStore(world2)
    strategy_id = store.strategies(store.run()["id"])[0]["id"]
    assert {
        r
        for r in (
            row["rank"] for row in store.conn.execute("SELECT rank FROM steps WHERE strategy_id = ?", (strategy_id,))
        )
    } == {0, 1}
    # One rank is started alone (torchrun's agent imported torch again first, 1.8 s a launch); two through
    # torchrun: training and the restore check, then the restore at world size 1 alone where there is one.
    for run_dir, ranks in ((world1, 1), (world2, 2)):
        for log in (run_dir / "logs").iterdir():
            launches = ["torch.distributed.run" in line for line in log.read_text().splitlines() if line[:2] == "$ "]
            assert launches[:2] == [ranks == 2] * 2 and not any(launches[2:]), (log, launches)


@pytest.mark.slow
def test_a_killed_strategy_is_recorded_and_the_others_go_on(tmp_path, nvme_root):
    """A rank killed by another process's SIGKILL: recorded as that (the kernel's OOM counters did not move,
    so it is not called an OOM), and the next strategy runs."""
    strategies = [dict(name="victim", engine="fsdp2"), dict(name="survivor", engine="fsdp2")]
    spec = write_spec(tmp_path, strategies, steps=120, verify_checkpoint=False)
    run_dir = tmp_path / "run"
    proc = start_cli("run", str(spec), "--out", str(run_dir))
    victim = wait_for_worker(proc, run_dir)
    victim.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out  # a failure, not a "does not fit"
    summaries = {s.name: s for s in summarize(RunStore(run_dir))}
    assert summaries["victim"].status == "failed"
    assert "killed by SIGKILL from outside offloadlab, not by the kernel's OOM killer" in summaries["victim"].reason
    assert summaries["survivor"].status == "done" and summaries["survivor"].steps_done == 120


def _swap_folders(nvme_root: Path, strategy: str) -> list[Path]:
    """The strategy's NVMe folders: offloadlab-RUN-TOKEN-STRATEGY."""
    return [p for p in nvme_root.iterdir() if p.name.startswith("offloadlab-run-") and p.name.endswith(f"-{strategy}")]


@pytest.mark.slow
def test_ctrl_c_stops_the_job_and_removes_what_the_run_created(tmp_path, nvme_root):
    bystander = nvme_root / "not-ours.bin"
    bystander.write_bytes(b"user data")
    strategies = [STRATEGIES[1] | {"name": "interrupted"}, STRATEGIES[0] | {"name": "never-started"}]
    spec = write_spec(tmp_path, strategies, steps=2000, nvme_path=str(nvme_root))
    run_dir = tmp_path / "run"
    proc = start_cli("run", str(spec), "--out", str(run_dir))
    worker = wait_for_worker(proc, run_dir)
    assert _swap_folders(nvme_root, "interrupted")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in CTRL_C_EXIT, out
    assert "interrupted" in out
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    assert not _swap_folders(nvme_root, "interrupted")
    assert bystander.read_bytes() == b"user data"
    store = RunStore(run_dir)
    assert store.run()["status"] == "interrupted"
    reasons = [s["reason"] for s in store.strategies(store.run()["id"])]
    assert reasons == ["interrupted by the user", "interrupted by the user before it started"]
    # compare says the run did not finish, and how long since it last recorded anything.
    assert re.search(r"\(interrupted, last update \d+ s ago\)", cli("compare", str(run_dir)).stdout)


def test_collective_volume_is_recorded_per_rank_and_step(world2):
    """Both engines reduce-scatter every fp32 gradient once a step at world size 2, on each rank."""
    from offloadlab.spec import ModelSpec
    from offloadlab.workload.model import gpt_config

    gradient_bytes = 4 * gpt_config(ModelSpec(preset="tiny"), 32).n_params
    store = RunStore(world2)
    for row in store.strategies(store.run()["id"]):
        scattered = {
            (e["rank"], e["step"]): json.loads(e["detail"])
            for e in store.events(row["id"], "comm.reduce_scatter")
            if json.loads(e["detail"])["phase"] == "train"
        }
        assert {rank for rank, _ in scattered} == {0, 1}, row["name"]
        assert all(t["bytes"] == gradient_bytes for t in scattered.values()), (row["name"], scattered)
        assert store.events(row["id"], "comm.all_gather"), row["name"]
    for summary in summarize(store):
        assert summary.comm_bytes_per_step >= gradient_bytes and summary.comm_seconds_per_step > 0


def test_model_facts_are_recorded_and_mfu_follows_from_them(world1, world2):
    """Both engines count every parameter (ZeRO-3 partitions at full size); MFU is per GPU over the peak table."""
    from dataclasses import replace

    from offloadlab.results import figures
    from offloadlab.results.steps import FollowedStrategy
    from offloadlab.results.summary import _model_facts
    from offloadlab.spec import ModelSpec
    from offloadlab.workload.model import gpt_config

    cfg = gpt_config(ModelSpec(preset="tiny"), 32)
    for run_dir, world in ((world1, 1), (world2, 2)):
        store = RunStore(run_dir)
        for row, summary in zip(store.strategies(store.run()["id"]), summarize(store)):
            followed = FollowedStrategy(row["id"])
            followed.update(store, finished=True)
            facts = _model_facts(followed)
            # what the peaks are held against: no GPU here, and this host's RAM
            assert facts.gpu_memory_bytes is None and facts.host_memory_bytes == psutil.virtual_memory().total
            assert (facts.n_params, facts.n_layers, facts.d_model) == (cfg.n_params, cfg.n_layers, cfg.d_model), row[
                "name"
            ]
            assert (facts.device_name, facts.world_size, facts.seq_len) == ("cpu", world, 32)
            assert summary.mfu_percent is None  # a CPU has no entry in the peak table
    on_h200 = replace(facts, device_name="NVIDIA H200", precision="bf16")
    per_gpu_flops = 1e5 / 2 * (6 * cfg.n_params + 12 * cfg.n_layers * cfg.d_model * 32)
    assert figures.mfu_percent(1e5, on_h200) == pytest.approx(100 * per_gpu_flops / 989e12)


def test_a_world_2_fsdp2_checkpoint_is_restored_and_verified_at_world_1(world2):
    """DCP reshards on load: the full state gathered at world 1 equals the one saved by two ranks, and the
    next step (same samples, twice the accumulation) gives the uninterrupted loss."""
    store = RunStore(world2)
    summaries = {s.name: s for s in summarize(store)}
    fsdp2 = summaries["fsdp2-cpu-offload"]
    assert fsdp2.checkpoint_verified is True, fsdp2.checkpoint_detail
    own, other = fsdp2.checkpoint_detail.split(" | restored at world size 1: ")
    for detail in (own, other):
        entries, total = re.search(r"(\d+)/(\d+) state entries equal", detail).groups()
        assert entries == total and int(total) > 10
    strategy_id = {r["name"]: r["id"] for r in store.strategies(store.run()["id"])}["fsdp2-cpu-offload"]
    (at_world_1,) = store.steps(strategy_id, phase="restored@world1")
    (uninterrupted,) = [r for r in store.steps(strategy_id) if r.step == at_world_1.step]
    assert at_world_1.loss == pytest.approx(uninterrupted.loss, rel=1e-4)
    # DeepSpeed's checkpoints need its universal-checkpoint conversion first: checked at world size 2 only.
    assert "world size 1" not in summaries["zero3-nvme"].checkpoint_detail


def test_the_workers_command_run_by_hand_changes_nothing_in_a_finished_run_or_a_live_one(world1, tmp_path):
    """A strategy's log shows the worker's command line; run again by hand it must not record a second
    training or a second checkpoint verdict (the checkpoint is gone: a verify would record a failure), nor,
    while the run trains that strategy, train beside it into the same store."""
    from offloadlab.results.rundir import RunDir
    from offloadlab.results.status import Status

    run_dir = copy_store(world1, tmp_path / "run")
    store = RunStore(run_dir, writable=True)
    row = next(r for r in store.strategies(store.run()["id"]) if r["name"] == "fsdp2")
    before = (row["checkpoint_verified"], row["checkpoint_detail"], len(store.steps(row["id"])))
    worker = [sys.executable, "-m", "offloadlab.train.worker", "--run-dir", str(run_dir), "--strategy", "fsdp2"]
    for live in (False, True):
        held = RunDir(run_dir).lock() if live else None  # as `offloadlab run` holds it, at the strategy
        if live:
            store.set_strategy_status(row["id"], Status.RUNNING)
        try:
            for mode in ("verify", "train"):
                proc = subprocess.run([*worker, "--mode", mode], capture_output=True, text=True, timeout=300)
                assert proc.returncode == 2, proc.stderr
                assert "error: fsdp2 is not being run by this process's `offloadlab run`" in proc.stderr
        finally:
            if held is not None:
                os.close(held)
    row = store.strategy(row["id"])
    assert (row["checkpoint_verified"], row["checkpoint_detail"], len(store.steps(row["id"]))) == before
    store.close()
    # A mistyped strategy or folder gets the error, not a traceback, and the folder is left as it was.
    not_a_run = tmp_path / "not-a-run"
    not_a_run.mkdir()
    for folder, strategy, says in ((run_dir, "fsdp3", "no strategy named 'fsdp3'"), (not_a_run, "fsdp2", "holds no")):
        command = [*worker[:4], str(folder), "--strategy", strategy, "--mode", "train"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not any(not_a_run.iterdir())


def test_workers_get_exact_pinned_sizes_unless_the_user_set_allocator_options(tmp_path):
    from offloadlab.checks.host import PINNED_EXACT_ABOVE
    from offloadlab.run.runner import worker_env

    assert worker_env({}, tmp_path)["PYTORCH_ALLOC_CONF"] == PINNED_EXACT_ABOVE
    for key in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env = worker_env({key: "expandable_segments:True"}, tmp_path)
        assert env.get("PYTORCH_ALLOC_CONF") in (None, "expandable_segments:True")


@pytest.mark.parametrize("width", [80, 120, 200])
def test_compare_fits_the_terminal_and_keeps_the_step_throughput_and_memory(world1, width):
    from rich.console import Console

    from offloadlab.results.tables import COLUMNS, compare_table

    summaries = summarize(RunStore(world1))
    console = Console(width=width, record=True)
    console.print(compare_table(world1, summaries, width))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    for s in summaries:
        for figure in (s.name, f"{s.median_step_time_s:.3f}", f"{s.tokens_per_s:,.0f}", f"{s.practicality:.0%}"):
            assert figure in text, (width, figure)
    # Every column of the narrower layouts is there; of this layout's own, the first ones that fit.
    tier = max(c.width for c in COLUMNS if width >= c.width)
    assert all(c.header.splitlines()[0] in text for c in COLUMNS if c.width < tier)
    own = [c.header.splitlines()[0] in text for c in COLUMNS if c.width == tier]
    assert own == sorted(own, reverse=True) and own[0]
    assert ("PCIe GB/s" in text) is (width >= 160) and ("stalls" in text) is (width >= 120)


def test_compare_with_long_names_gives_up_the_widest_layouts_last_columns_first(world1):
    from dataclasses import replace

    from rich.console import Console

    from offloadlab.results.tables import COLUMNS, compare_table

    summaries = [replace(s, name=f"{s.name}-with-a-name-as-long-as-a-users") for s in summarize(RunStore(world1))]
    table = compare_table(world1, summaries, 160)
    console = Console(width=160, record=True)
    console.print(table)
    assert max(len(line) for line in console.export_text().splitlines()) <= 160
    shown = {str(c.header) for c in table.columns}
    # Given up in order: the widest layout's columns from its last, then the next layout's.
    order = sorted((c for c in COLUMNS if 0 < c.width <= 160), key=lambda c: (c.width, COLUMNS.index(c)))
    kept = [c.header in shown for c in order]
    assert kept == sorted(kept, reverse=True) and not all(kept)
    assert all(c.header in shown for c in COLUMNS if c.width == 0)


def test_a_failed_rank_is_named_by_its_last_words_not_torchruns_report():
    """A rank that aborts leaves torchrun's report last; the reason was its "=====" rule."""
    from offloadlab.run.runner import crash_reason

    rank = "python3: pin_tensor.cpp:48: alloc: Assertion `nullptr != pinned_buffer' failed."
    report = [
        "E1205 00:00:17.121000 3809 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) "
        "local_rank: 0 (pid: 3814) of binary: python3",
        "Traceback (most recent call last):",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  exitcode  : -6 (pid: 3814)  (SIGABRT)",
        "=====================================================",
    ]
    output = "\n".join(["$ torchrun ...", "DeepSpeed's op built", rank, *report]) + "\n"
    assert crash_reason(1, output) == f"a rank died of SIGABRT: {rank}"
    mlock = "mlock failed to allocate 64004096 bytes with error no 12 msg Cannot allocate memory"
    reason = crash_reason(1, output.replace(rank, f"{mlock}\n{rank}"))
    assert reason.startswith(f"a rank died of SIGABRT: {mlock}") and "raise ulimit -l" in reason
    assert crash_reason(1, "$ torchrun ...\nValueError: bad spec\n") == "exited with code 1: ValueError: bad spec"
    # One rank is started without torchrun: no report, its signal is its exit code's.
    assert crash_reason(-6, f"$ python -m offloadlab.train.worker ...\n{rank}\n") == f"a rank died of SIGABRT: {rank}"
    # A rank that exits with an error of its own before offloadlab can record it (seen on a GPU host whose
    # ranks could not import offloadlab): its words, not the report's rule.
    missing = "python3: Error while finding module specification for 'offloadlab.train.worker'"
    exited = (
        output.replace(rank, missing).replace("exitcode: -6", "exitcode: 1").replace("-6 (pid: 3814)  (SIGABRT)", "1")
    )
    assert crash_reason(1, exited) == f"exited with code 1: {missing}"
