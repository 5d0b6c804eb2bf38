"""Hours-long runs: summaries that follow a live store read only what is new, and agree with a full read."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sqlite3
import sys
import tarfile
from pathlib import Path

import pytest
from rich.console import Console

from conftest import copy_store
from offloadlab.results.figures import MODEL_FACTS_EVENT
from offloadlab.results.report import write_report
from offloadlab.results.rundir import DB_NAME, RunDir
from offloadlab.results.status import Status
from offloadlab.results.steps import TELEMETRY_NOTE, FollowedStrategy, StepFigures
from offloadlab.results.store import RunStore, connect_read_only
from offloadlab.results.summary import SummaryCache, store_figures, summarize
from offloadlab_tui.reader import RunReader

REPO = Path(__file__).resolve().parents[1]
H200_RUN = REPO / "bench/results/2026-12-03-h200-s10/run_a.tar.gz"  # four strategies, 124 steps, 51k samples


@pytest.fixture(scope="module")
def h200_store(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("h200")
    with tarfile.open(H200_RUN) as tar:
        tar.extractall(folder, filter="data")
    return folder / "run_a"


def _replay_until(source: sqlite3.Connection, target: sqlite3.Connection, t: float, done: set) -> None:
    """Copy what the run had written by time t, as its processes wrote it: steps when they ended, samples
    and events as they were taken, a strategy's status once it finished."""
    for table, column in (("steps", "t_end"), ("samples", "t"), ("events", "t_start")):
        rows = source.execute(f"SELECT rowid, * FROM {table} WHERE {column} <= ? ORDER BY rowid", (t,)).fetchall()
        new = [r for r in rows if (table, r[0]) not in done]
        done.update((table, r[0]) for r in new)
        if new:
            marks = ", ".join("?" * (len(new[0]) - 1))
            # An event's id is given as it is written, as the store does (the original ids follow the
            # order the ranks committed, not the order of their start times).
            values = [(None, *tuple(r)[2:]) if table == "events" else tuple(r)[1:] for r in new]
            target.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    for row in source.execute("SELECT id, status, finished_at, started_at FROM strategies"):
        started = row[3] is not None and row[3] <= t
        status = row[1] if row[2] is not None and row[2] <= t else "running" if started else "pending"
        target.execute("UPDATE strategies SET status = ?, started_at = ? WHERE id = ?", (status, row[3], row[0]))
    target.commit()


def _replayed(h200_store: Path, tmp_path: Path, sampled: bool = False):
    """Session 10's H200 store, replayed into a fresh one 30 s of its time at a time: (when, the replay's
    store) after each slice. `sampled`: each started strategy's sampler stores what it stores of its
    steps after each slice (the store was written before it did)."""
    source = sqlite3.connect(h200_store / DB_NAME)
    replay = tmp_path / "replay"
    replay.mkdir()
    RunStore(replay, create_schema=True).close()
    target = sqlite3.connect(replay / DB_NAME)
    for table in ("runs", "strategies"):
        rows = source.execute(f"SELECT * FROM {table}").fetchall()
        target.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    target.execute("UPDATE strategies SET status = 'pending', finished_at = NULL")
    start, end = source.execute("SELECT MIN(t), MAX(t) FROM samples").fetchone()
    done, t = set(), start
    samplers: dict[int, StepFigures] = {}
    while t < end + 30:
        t += 30
        _replay_until(source, target, t, done)
        if sampled:
            _store_step_figures(replay, samplers)
        store = RunStore(replay)
        try:
            yield f"+{t - start:.0f} s", store
        finally:
            store.close()


def _store_step_figures(replay: Path, samplers: dict[int, StepFigures]) -> None:
    with contextlib.closing(RunStore(replay, writable=True)) as store:
        for row in store.strategies(store.run()["id"]):
            if row["status"] != "pending":
                sampler = samplers.setdefault(row["id"], StepFigures(row["id"]))
                sampler.store_final(store, strategy_finished=Status(row["status"]).finished)


@pytest.mark.parametrize("sampled", [False, True], ids=["read-from-rows", "sampler-stored"])
def test_a_followed_store_sums_up_as_a_full_read_at_every_moment(h200_store, tmp_path, sampled):
    """After each slice of the replay the summary kept up to date through one cache equals a summary read
    from scratch, and at the end the original's. A step's samples arrive after the step: a cache that froze
    a step's figures too early, or missed rows between reads, would differ. Sampler-stored: the steps'
    figures and totals are stored as the sampler stores them, and read from there; a total stored before
    its rows and events were all in would differ from the original's."""
    cache, slices = SummaryCache(), 0
    for when, store in _replayed(h200_store, tmp_path, sampled):
        followed, fresh = summarize(store, cache), summarize(store)
        assert len(followed) == len(fresh) and all(_same(a, b, when) for a, b in zip(followed, fresh))
        slices += 1
    assert slices > 10
    assert all(_same(a, b, "the end") for a, b in zip(followed, summarize(RunStore(h200_store))))
    if sampled:  # every step's totals were stored, and are what was read
        with sqlite3.connect(tmp_path / "replay" / DB_NAME) as conn:
            steps = conn.execute("SELECT COUNT(*) FROM steps WHERE rank = 0 AND phase = 'train'").fetchone()
            assert conn.execute("SELECT COUNT(*) FROM step_totals").fetchone() == steps


def test_the_tuis_cache_recomputes_a_running_strategys_figures_at_its_share_and_follows_its_steps(
    h200_store, tmp_path
):
    """recompute_share (the TUI's): between two computations of a running strategy's figures (here none
    after its first: a share of a billionth of a core), its step count follows every read and the rest are
    those first computed; a strategy that has ended has every figure of a full read."""
    cache, kept_running = SummaryCache(recompute_share=1e-9), 0
    first: dict[str, dict] = {}
    for when, store in _replayed(h200_store, tmp_path):
        for followed, fresh in zip(summarize(store, cache), summarize(store)):
            if followed.status is not Status.RUNNING:
                _same(followed, fresh, when)
                continue
            assert followed.steps_done == fresh.steps_done, when
            mine = {k: v for k, v in followed.as_dict().items() if k != "steps_done"}
            first.setdefault(followed.name, mine)
            assert mine == first[followed.name], when
            kept_running += mine != {k: v for k, v in fresh.as_dict().items() if k != "steps_done"}
    assert kept_running >= 5  # reads whose figures a full read had moved on from (7 of this replay)


def _same(a, b, when: str) -> bool:
    """Equal figures; counters summed from another starting sample differ in the last bits only."""
    for key, value in a.as_dict().items():
        other = b.as_dict()[key]
        close = value == pytest.approx(other, rel=1e-12) if isinstance(value, float) else value == other
        assert close, f"{a.name} at {when}: {key} {value} != {other}"
    return True


def test_a_strategy_run_without_the_sampler_has_its_steps_measured_once(h200_store, tmp_path):
    """telemetry_hz = 0 writes no samples: every step used to wait for samples past its end, so each poll
    of a live run recomputed all of its steps."""
    run_dir = copy_store(h200_store, tmp_path / "unsampled")
    with sqlite3.connect(run_dir / DB_NAME) as conn:
        conn.execute("DELETE FROM samples")
    store = RunStore(run_dir)
    strategy = store.strategies(store.run()["id"])[0]
    followed = FollowedStrategy(strategy["id"])
    followed.update(store, finished=False)  # as while the run is live
    steps = store.steps(strategy["id"], rank=0)
    assert len(followed.telemetry) == len(steps) and not followed._open


sys.path.insert(0, str(REPO / "bench"))
import long_run_ui  # noqa: E402  (the bench's store builder: the run's own writes, in its order)


def _build(folder: Path, hz: float) -> Path:
    """Two strategies of 1.75 hours, a step a minute: long enough that the report's and the TUI's windows
    are drawn from the stored bins."""
    shape = long_run_ui.Shape(("zero3-nvme", "zero2-cpu"), hours=1.75, step_s=60.0, gpus=1, hz=hz)
    return long_run_ui.build(folder, f"{hz:g}hz", shape, Console(quiet=True))


def _read_everything(run_dir: Path, monkeypatch) -> tuple[int, list]:
    """What compare, the TUI and the report read, as SQLite's count of virtual-machine steps (the same
    for the same work on any machine), and compare's figures."""
    steps = [0]

    def counted(run_dir):
        conn = connect_read_only(run_dir)
        conn.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1) or 0, 100)
        return conn

    monkeypatch.setattr("offloadlab.results.store.connect_read_only", counted)
    with contextlib.closing(RunStore(run_dir)) as store:
        figures = summarize(store)
    RunReader(run_dir).read()
    write_report(run_dir, run_dir / "report.html")
    monkeypatch.undo()
    return steps[0], figures


def test_readers_cost_follows_the_steps_not_the_samples(tmp_path, monkeypatch):
    """The same steps sampled at 4 Hz instead of 1 (4x the samples): compare, the TUI and the report read
    the steps' stored figures and the samples' stored bins, so their work stays within 1.3x. The 4-Hz
    store with those tables emptied (as a store written before them) is read the old way, from every
    sample: the same figures, at several times the work."""
    slow, fast = _build(tmp_path, 1.0), _build(tmp_path, 4.0)
    work_slow, _ = _read_everything(slow, monkeypatch)
    work_fast, figures = _read_everything(fast, monkeypatch)
    assert work_fast < 1.3 * work_slow, (work_slow, work_fast)
    with sqlite3.connect(fast / DB_NAME) as conn:
        assert conn.execute("SELECT COUNT(*) FROM step_telemetry").fetchone()[0] > 0
        conn.execute("DELETE FROM step_telemetry")
        conn.execute("DELETE FROM sample_bins")
        conn.execute("DELETE FROM strategy_figures")
    (fast / "report.html").unlink()
    work_old, figures_old = _read_everything(fast, monkeypatch)
    assert work_old > 3 * work_fast, (work_fast, work_old)
    assert all(_same(a, b, "the old way") for a, b in zip(figures, figures_old))


def test_the_tuis_longer_windows_are_read_from_the_bins(tmp_path):
    """`w` in the TUI: the sampled sparklines over the last hour are 10-s bins (360), not 3,600 samples;
    the running strategy's last 10 minutes are its samples, kept between polls; the figure of a finished
    strategy (its steady mean) does not depend on the window."""
    run = _build(tmp_path, 1.0)
    lock = RunDir.at(run).lock()  # the run is live: its last strategy runs
    reader = RunReader(run)
    ten_minutes = {s.name: s for s in reader.read().strategies}
    reader.window_s = 3600.0
    hour = {s.name: s for s in reader.read().strategies}
    os.close(lock)
    assert hour["zero2-cpu"].summary.status is Status.RUNNING
    assert 590 <= len(ten_minutes["zero2-cpu"].host_cpu_percent.values) <= 601  # one sample a second
    assert 59 <= len(ten_minutes["zero3-nvme"].host_cpu_percent.values) <= 60  # finished: its bins
    assert hour["zero3-nvme"].host_cpu_percent.figure == pytest.approx(
        ten_minutes["zero3-nvme"].host_cpu_percent.figure
    )
    for view in hour.values():
        assert 359 <= len(view.host_cpu_percent.values) <= 361, view.name


def test_the_running_strategys_windows_kept_between_polls_equal_a_fresh_read(tmp_path):
    """Each poll adds only the sample times since the last to the running strategy's 10-minute windows,
    summed over its GPUs: after more steps and samples land, they hold what a reader opened afresh reads."""
    shape = long_run_ui.Shape(("zero2-cpu",), hours=0.5, step_s=20.0, gpus=2, hz=2.0)
    run = long_run_ui.build(tmp_path, "live", shape, Console(quiet=True))
    lock = RunDir.at(run).lock()
    kept = RunReader(run)
    kept.read()
    store = RunStore(run, writable=True)
    row = store.strategies(store.run()["id"])[-1]
    last = store.steps(row["id"], rank=0)[-1]
    writer = long_run_ui.StrategyWriter(store, row["id"], row["name"], shape, last.t_end)
    writer.step, writer.sample_t = last.step, store.newest_sample_t(row["id"]) + 1 / shape.hz
    writer.figures.followed.update(store, False)  # as the bench's live writer carries a run on
    writer.figures.stored_through = max(writer.figures.followed.telemetry, default=0)
    for _ in range(2):  # two polls' worth: a step and its samples each
        writer.add_step()
        writer.sample_until(writer.t)
        writer.flush()
        polled = kept.read().strategies[-1]
    store.close()
    fresh = RunReader(run).read().strategies[-1]
    os.close(lock)
    for series in ("pcie_tx_bytes_per_s", "disk_read_bytes_per_s", "host_cpu_percent"):
        assert getattr(polled, series).values == getattr(fresh, series).values, series
    assert polled.pcie_tx_bytes_per_s.values[-1] == pytest.approx(
        1e9 * 2 * (0.5 + 0.5 * math.sin((writer.sample_t - 1 / shape.hz) / shape.step_s))
    )  # the last sample time, both GPUs summed


def test_the_reports_charts_overlay_the_strategies_and_combine_the_gpus(tmp_path):
    """Two strategies of two hours on 2 GPUs: one chart a metric with both strategies on it, each GPU metric one
    line a strategy (summed, averaged or the fullest GPU, as the title says), time ticks at round h:mm; the
    step-time rows share one scale, the start-up's long first step marked above it."""
    shape = long_run_ui.Shape(("zero3-nvme", "zero2-cpu"), hours=2.0, step_s=60.0, gpus=2, hz=1.0)
    run_dir = long_run_ui.build(tmp_path, "two-gpus", shape, Console(quiet=True))
    write_report(run_dir, run_dir / "report.html")
    page = (run_dir / "report.html").read_text()
    assert page.count("<svg") == 3 + 6 and "no samples of" not in page
    for title in ("GPU memory used", "PCIe, sum of 2 GPUs", "GPU utilization, mean of 2 GPUs"):
        assert title in page, title
    assert "max of 2 GPUs</text>" in page  # the memory chart's title, after its note
    for label in ("zero3-nvme: to GPU", "zero2-cpu: to host", "zero3-nvme", "zero2-cpu"):
        assert f">{label}</text>" in page, label
    assert all(f">{tick}</text>" in page for tick in ("0:00", "0:30", "1:00", "1:30", "2:00"))
    # The first step is 8 steps long; the stall line 3 medians: every row's scale ends at 1.1x that line.
    assert page.count(">1 above the scale (max 480 s)</text>") == 2


def test_an_ended_strategys_stored_figures_are_the_ones_its_steps_give(h200_store, tmp_path):
    """The H200 store was written before figures were stored: read the old way. Its strategies' figures,
    stored as the runner stores them at a strategy's end, read back equal (every field, floats exact) at a
    fraction of the work; a strategy whose row changed after (a checkpoint result) is read the old way again."""
    run_dir = copy_store(h200_store, tmp_path / "stored")
    with contextlib.closing(RunStore(run_dir)) as store:
        before = summarize(store)
        work_before = _work(store, summarize)
    with contextlib.closing(RunStore(run_dir, create_schema=True)) as store:  # as the runner opens it
        for row in store.strategies(store.run()["id"]):
            store_figures(store, row["id"])
    with contextlib.closing(RunStore(run_dir)) as store:
        after = summarize(store)
        work_after = _work(store, summarize)
    assert [s.name for s in after] == [s.name for s in before] and all(a == b for a, b in zip(after, before))
    assert work_after < work_before / 5, (work_before, work_after)
    with contextlib.closing(RunStore(run_dir, writable=True)) as store:
        changed = store.strategies(store.run()["id"])[0]
        store.set_checkpoint_result(changed["id"], False, "checked again")
    with contextlib.closing(RunStore(run_dir)) as store:
        again = {s.name: s for s in summarize(store)}
    assert again[changed["name"]].checkpoint_detail == "checked again"
    assert again[changed["name"]] == dataclasses.replace(before[0], checkpoint_verified=False,
                                                         checkpoint_detail="checked again")  # fmt: skip


def test_a_running_strategys_steps_are_read_from_their_stored_totals(tmp_path):
    """The sampler stores each step's sums over the ranks and rank 0's timings once every rank has written
    it: a read of a strategy still running on 4 ranks takes one row a step, not its ranks' rows and its
    phase events. The same figures as the store with those rows deleted (a store written before them, read
    the old way), at a fraction of the work."""
    shape = long_run_ui.Shape(("zero3-nvme",), hours=2.0, step_s=20.0, gpus=4, hz=1.0)
    run_dir = long_run_ui.build(tmp_path, "live", shape, Console(quiet=True))  # its strategy left running
    lock = RunDir.at(run_dir).lock()
    try:
        with contextlib.closing(RunStore(run_dir)) as store:
            (summary,) = summarize(store)
            work = _work(store, summarize)
            stored = store.conn.execute("SELECT COUNT(*) FROM step_totals").fetchone()[0]
        with sqlite3.connect(run_dir / DB_NAME) as conn:
            conn.execute("DELETE FROM step_totals")
        with contextlib.closing(RunStore(run_dir)) as store:
            (old_way,) = summarize(store)
            work_old = _work(store, summarize)
    finally:
        os.close(lock)
    assert summary.status is Status.RUNNING and stored == summary.steps_done - 1  # all but the newest
    assert summary.nvme_wait_seconds and summary.phase_seconds and summary.disk_read_bytes_per_step
    assert _same(summary, old_way, "the old way")
    assert work < 0.6 * work_old, (work, work_old)  # 797 and 1726 SQLite steps


READ_INDEXES = ("steps_of_rank", "steps_by_step", "events_by_step")


def test_a_running_strategys_first_read_seeks_its_events_of_no_step(tmp_path):
    """A first read of a running strategy whose steps' totals are stored takes its events of no step (the
    model's facts, the sampler's notes) by a seek, and rank 0's steps through an index of their own; not a
    walk over every step's events and every rank's rows. A store written before those indexes gives the
    same figures, the old way, at more work. A step's other events (a checkpoint's save) are not kept."""
    shape = long_run_ui.Shape(("zero3-nvme",), hours=6.0, step_s=20.0, gpus=4, hz=0.2)
    run_dir = long_run_ui.build(tmp_path, "live", shape, Console(quiet=True))  # its strategy left running
    with contextlib.closing(RunStore(run_dir, writable=True)) as store:
        strategy_id = store.strategies(store.run()["id"])[0]["id"]
        store.add_events(strategy_id, 0, [(40, "checkpoint_save", 1.0, 2.0, "ckpt")])
        store.add_events(strategy_id, None, [(None, TELEMETRY_NOTE, 1.0, None, "no NVML")])
    lock = RunDir.at(run_dir).lock()
    try:
        with contextlib.closing(RunStore(run_dir)) as store:
            (summary,) = summarize(store)
            work = _work(store, summarize)
            followed = FollowedStrategy(strategy_id)
            followed.update(store, finished=False)
        with sqlite3.connect(run_dir / DB_NAME) as conn:
            stored = conn.execute("SELECT COUNT(*) FROM step_totals").fetchone()[0]
            for index in READ_INDEXES:
                conn.execute(f"DROP INDEX {index}")
        with contextlib.closing(RunStore(run_dir)) as store:
            (old_way,) = summarize(store)
            work_old = _work(store, summarize)
    finally:
        os.close(lock)
    assert summary.status is Status.RUNNING and stored == summary.steps_done - 1
    assert sorted(followed.events) == sorted([MODEL_FACTS_EVENT, TELEMETRY_NOTE])
    assert _same(summary, old_way, "the old way")
    assert work < 0.6 * work_old, (work, work_old)  # 724 and 1489 SQLite steps


def test_a_step_another_rank_had_not_written_as_the_sampler_ended_is_summed_by_its_readers(tmp_path):
    """The sampler ends after rank 0's last step, and rank 1's row of it may come after: that step's
    totals are not stored (they would lack rank 1 for good); a reader sums its rows once they are in."""
    shape = long_run_ui.Shape(("zero2-cpu",), hours=0.1, step_s=20.0, gpus=2, hz=1.0)
    run_dir = long_run_ui.build(tmp_path, "late", shape, Console(quiet=True))  # its strategy left running
    with contextlib.closing(RunStore(run_dir, writable=True)) as store:
        strategy_id = store.strategies(store.run()["id"])[0]["id"]
        before = store.steps(strategy_id, rank=0)[-1]
        last = long_run_ui.record(before.step + 1, before.t_end, before.t_end + 20.0)
        store.add_step(strategy_id, 0, last)
        StepFigures(strategy_id).store_final(store, strategy_finished=True)
        stored = store.conn.execute("SELECT MAX(step) FROM step_totals").fetchone()[0]
        store.add_step(strategy_id, 1, last)
        followed = FollowedStrategy(strategy_id)
        followed.update(store, finished=True)
    assert stored == before.step
    assert followed.all_ranks[last.step].disk_read_bytes == 2 * last.disk_read_bytes


def _work(store: RunStore, read) -> int:
    """SQLite's virtual-machine steps for `read(store)`: the same for the same work on any machine."""
    steps = [0]
    store.conn.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1) or 0, 100)
    read(store)
    store.conn.set_progress_handler(None, 100)
    return steps[0]


def test_a_short_strategys_chart_line_runs_from_its_first_sample_to_its_last(tmp_path):
    """Bins of a 72-second strategy sampled at 10 Hz: the chart's bins span its samples, first to last (the
    stored 10-s bins' edges once ended it at the start of its last 10 s, and a strategy within one bin was
    not drawn at all)."""
    shape = long_run_ui.Shape(("zero2-cpu",), hours=0.02, step_s=6.0, gpus=1, hz=10.0)
    store = RunStore(long_run_ui.build(tmp_path, "short", shape, Console(quiet=True)))
    strategy_id = store.strategies(store.run()["id"])[0]["id"]
    samples = store.samples(strategy_id, "host.cpu(%)")
    (points,) = store.binned_samples(strategy_id, "host.cpu(%)", 600, 3).values()
    half = (points[1][0] - points[0][0]) / 2
    assert points[0][0] - half == pytest.approx(samples[0][0]) and points[-1][0] + half == pytest.approx(
        samples[-1][0]
    )
    assert all(value is not None for _, value in points)
