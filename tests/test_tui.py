"""The Textual TUI, driven by Pilot against run stores written by real runs of the real CLI.

Functional tests read stores from real tiny runs (world1, a quick tune, a live run started from the TUI);
the snapshot tests use a store written through RunStore with fixed numbers, since real timings differ
from run to run and a snapshot must not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import sqlite3
import statistics
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import DataTable, Sparkline, Static

from conftest import cli, copy_store, h200_budget_run_with_its_plan, wait_for_worker
from offloadlab.results.rundir import RunDir
from offloadlab.results.status import Status
from offloadlab.results.steps import SWAP_EVENT
from offloadlab.results.store import DB_NAME, RunStore, StepRecord, TunePoint
from offloadlab.results.summary import summarize
from offloadlab.results.tables import fmt_or_dash, human_bytes
from offloadlab.spec import AioSettings
from offloadlab_tui import processes
from offloadlab_tui.app import make_app
from offloadlab_tui.reader import ReaderError, find_runs, read_run
from offloadlab_tui.screens import DashboardScreen, RanksScreen, RunsScreen, TuneScreen
from offloadlab_tui.widgets import CompareTable, GpuTable, RankTable, StrategyPanel, TuneHeatmap

SIZE = (80, 24)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tuned_dir(tmp_path_factory, nvme_root) -> Path:
    out = tmp_path_factory.mktemp("tui-tune") / "tune-quick"
    cli("tune", "--nvme", str(nvme_root), "--quick", "--out", str(out))
    return out


@pytest.fixture
def root(tmp_path, world1, tuned_dir) -> Path:
    """A runs folder holding a copy of the real four-strategy run and of a real quick tune."""
    copy_store(world1, tmp_path / "runs" / "world1")
    copy_store(tuned_dir, tmp_path / "runs" / "tune-quick")
    return tmp_path / "runs"


async def wait_until(pilot, predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the TUI never showed what was expected"
        await pilot.pause(0.1)


def text_of(widget: Static) -> str:
    return str(widget.render())


def cell(table: DataTable, row_key: str, column: str) -> str:
    """The cell under the column of that label."""
    return str(table.get_cell(row_key, column))


async def start_job(pilot, app, key: str, answer: str) -> processes.Job:
    """In the runs browser, press `key` and answer its prompt: the job the TUI then starts."""
    await go(pilot, "r", RunsScreen)
    await pilot.press(key)
    await wait_until(pilot, lambda: pilot.app.screen.query("Input"))
    await pilot.press(*answer)
    await pilot.press("enter")
    await wait_until(pilot, lambda: len(app.jobs) == 1)
    return app.jobs[0]


async def go(pilot, key: str, screen_type) -> None:
    """Press a key that changes screens, and wait until that screen is the one shown."""
    await pilot.press(key)
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, screen_type))


def panels(app) -> dict[str, StrategyPanel]:
    return {p.strategy_name: p for p in app.screen.query(StrategyPanel) if p.view is not None}


def drawn(app, strategies: int) -> bool:
    """The dashboard shows that many panels, their sampled series included (a first read leaves them to
    the next)."""
    shown = getattr(app.screen, "shown", None)
    return len(panels(app)) == strategies and shown is not None and not shown.samples_pending


def test_the_dashboard_shows_the_runs_own_numbers(root):
    expected = {s.name: s for s in summarize(RunStore(root / "world1"))}
    store = RunStore(root / "world1")
    ids = {r["name"]: r["id"] for r in store.strategies(store.run()["id"])}

    async def scenario():
        app = make_app(root=root, poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            # Both stores are under root; the dashboard follows the newest run, not the tune.
            await wait_until(pilot, lambda: drawn(app, 4))
            assert isinstance(app.screen, DashboardScreen)
            table = app.screen.query_one(CompareTable)
            for name, summary in expected.items():
                panel = panels(app)[name]
                steps = [r.step_time_s for r in store.steps(ids[name], rank=0)]
                assert panel.query_one("#m-step Sparkline", Sparkline).data == steps
                # Finished: the figure is the mean of the steady steps (the first left out), not the last step.
                steady = f"{statistics.fmean(steps[1:]):.3f} s mean"
                assert text_of(panel.query_one("#m-step .metric-value")) == steady
                assert text_of(panel.query_one("#m-step .metric-range")) == f"{min(steps):.3f} .. {max(steps):.3f} s"
                phase, share = summary.bound_by  # the engines time forward, backward and optimizer
                assert f"bound by {phase} {share:.0%}" in text_of(panel.query_one(".phases"))
                assert f"step {summary.steps_done} of {summary.steps_planned}" in text_of(
                    panel.query_one(".panel-title")
                )
                # No GPU here: the GPU's series are left out rather than waiting for data.
                assert not panel.query_one("#m-gpu").display
                # Host CPU over the steady steps, as the sampler read it (a tiny run's steady steps can
                # fall between two samples on a slow machine).
                steady_steps = store.steps(ids[name], rank=0)[1:]
                first, last = steady_steps[0].t_start, steady_steps[-1].t_end
                cpu = [v for t, _, v in store.samples(ids[name], "host.cpu(%)", after_t=first) if t <= last]
                shown = f"{statistics.fmean(cpu):.0f}% mean" if cpu else "no data yet"
                assert text_of(panel.query_one("#m-cpu .metric-value")) == shown
                assert (
                    cell(table, name, "p50 / p90 s")
                    == f"{summary.median_step_time_s:.3f} / {summary.p90_step_time_s:.3f}"
                )
                assert cell(table, name, "stalls") == f"{summary.stalls} stall{'s' * (summary.stalls != 1)}"
                assert cell(table, name, "tokens/s") == f"{summary.tokens_per_s:,.0f}"
                assert (
                    cell(table, name, "practical") == f"{summary.practicality:.0%}"
                )  # against fsdp2, which offloads nothing
                assert cell(table, name, "MFU") == "-"  # MFU: a CPU is not in the peak table
                assert cell(table, name, "Δ loss") == f"{summary.last_loss_deviation:+.2%}"
                # The NVMe strategy's wait for its swaps; the others swap nothing.
                assert (summary.nvme_wait_share is not None) is (name == "zero3-nvme")
                assert cell(table, name, "NVMe wait") == fmt_or_dash(summary.nvme_wait_share, "{:.0%}")
                assert cell(table, name, "comm/step") == human_bytes(summary.comm_bytes_per_step)
                assert cell(table, name, "bound by") == f"{phase} {share:.0%}"
                assert (
                    cell(table, name, "opt threads, M params/s")
                    == f"{summary.cpu_threads}, {summary.optimizer_params_per_s / 1e6:,.0f}"
                )
                assert cell(table, name, "ckpt") == "verified"
            # The NVMe strategy's disk series moved (it wrote its swap files under the temp drive).
            assert max(panels(app)["zero3-nvme"].view.disk_write_bytes_per_s.values) > 0

    asyncio.run(scenario())


def test_keys_move_between_screens_and_open_a_run(root):
    async def scenario():
        app = make_app(root=root, poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await go(pilot, "t", TuneScreen)
            heatmap = app.screen.query_one(TuneHeatmap)
            await wait_until(pilot, lambda: heatmap.row_count > 0)
            tune = RunStore(root / "tune-quick")
            best = next(p for p in tune.tune_points(tune.run()["id"]) if p.is_best)
            cells = [str(c) for row in range(heatmap.row_count) for c in heatmap.get_row_at(row)]
            assert any(c.strip().startswith(f"{best.score_gbps:.2f}*") for c in cells), cells
            threads, grid = app.screen.threads, [heatmap.get_row_at(r) for r in range(heatmap.row_count)]
            await pilot.press("right_square_bracket")
            assert app.screen.threads != threads  # another thread count's grid
            assert [heatmap.get_row_at(r) for r in range(heatmap.row_count)] != grid
            await go(pilot, "r", RunsScreen)
            runs = app.screen.query_one("#runs", DataTable)
            await wait_until(pilot, lambda: runs.row_count == 2)
            row = next(i for i in range(runs.row_count) if runs.get_row_at(i)[0] == "world1")
            runs.move_cursor(row=row)
            await go(pilot, "enter", DashboardScreen)
            assert app.pinned_run == root / "world1"
            await wait_until(pilot, lambda: len(panels(app)) == 4)
            footer = " ".join(b.binding.description for b in app.active_bindings.values() if b.binding.show)
            assert all(word in footer for word in ("Dashboard", "Tune", "Runs", "Quit"))

    asyncio.run(scenario())


def test_a_run_opened_by_path_lists_the_runs_beside_it(root, tmp_path, monkeypatch):
    """`offloadlab tui OUT/RUN` from elsewhere: `r` said "no run directories under runs yet"."""
    from tui.app import root_of

    monkeypatch.chdir(tmp_path)  # no ./runs here
    run = root / "world1"
    assert root_of(run, None) == root.resolve() and root_of(run, tmp_path) == tmp_path
    assert root_of(None, None) == Path("runs")
    # `offloadlab tui RUN` leaves the root to the TUI (it used to pass ./runs always).
    given = []
    monkeypatch.setattr("offloadlab_tui.app.main", given.append)
    from click.testing import CliRunner

    from offloadlab.cli import main

    assert CliRunner().invoke(main, ["tui", str(run)]).exit_code == 0
    assert given == [[str(run)]]

    async def scenario():
        app = make_app(root=root_of(run, None), run_dir=run, poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await go(pilot, "r", RunsScreen)
            runs = app.screen.query_one("#runs", DataTable)
            await wait_until(pilot, lambda: runs.row_count == 2)
            assert {runs.get_row_at(i)[0] for i in range(2)} == {"world1", "tune-quick"}

    asyncio.run(scenario())


def test_a_run_that_appears_while_open_is_picked_up(tmp_path, world1):
    root = tmp_path / "runs"
    root.mkdir()

    async def scenario():
        app = make_app(root=root, poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "no runs under" in text_of(app.screen.query_one("#message")))
            copy_store(world1, root / "arrived")
            await wait_until(pilot, lambda: len(panels(app)) == 4)
            assert not app.screen.query_one("#message").display
            await go(pilot, "r", RunsScreen)
            runs = app.screen.query_one("#runs", DataTable)
            await wait_until(pilot, lambda: runs.row_count == 1 and runs.get_row_at(0)[0] == "arrived")

    asyncio.run(scenario())


def test_a_deleted_or_corrupt_store_gives_a_message_not_a_traceback(tmp_path, world1):
    run_dir = copy_store(world1, tmp_path / "runs" / "doomed")
    corrupt = tmp_path / "runs" / "corrupt"
    corrupt.mkdir()
    (corrupt / DB_NAME).write_bytes(b"this is not SQLite" * 100)

    async def scenario():
        app = make_app(root=tmp_path / "runs", run_dir=run_dir, poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: len(panels(app)) == 4)
            for path in run_dir.glob(f"{DB_NAME}*"):
                path.unlink()
            message = app.screen.query_one("#message")
            await wait_until(pilot, lambda: "or it was deleted" in text_of(message))
            app.open_dir(corrupt)
            await wait_until(pilot, lambda: "is not a readable SQLite database" in text_of(message))
            await go(pilot, "r", RunsScreen)
            runs = app.screen.query_one("#runs", DataTable)
            await wait_until(pilot, lambda: runs.row_count == 1)
            assert str(runs.get_row_at(0)[2]).startswith("unreadable")
        assert app.return_code in (0, None)

    asyncio.run(scenario())
    with pytest.raises(ReaderError, match="is not a readable SQLite database"):
        read_run(corrupt)
    with pytest.raises(ReaderError, match=r"is a folder of runs, not one: `offloadlab tui --root .*runs` follows"):
        read_run(tmp_path / "runs")  # a new user's `offloadlab tui runs/` read "no run store here"


@pytest.mark.slow
def test_a_live_run_started_from_the_tui_shows_progress_and_failure_and_outlives_it(tmp_path, monkeypatch):
    from conftest import write_spec

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    spec = write_spec(
        tmp_path,
        [dict(name="victim", engine="fsdp2"), dict(name="survivor", engine="fsdp2")],
        steps=300,
        verify_checkpoint=False,
    )
    root = tmp_path / "runs"
    jobs: list[processes.Job] = []

    async def scenario():
        app = make_app(root=root, poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            job = await start_job(pilot, app, "s", str(spec))
            jobs.append(job)
            worker = await asyncio.to_thread(wait_for_worker, job.process, job.out_dir)
            # The ranks view finds the rank by the PID it recorded, running, with its memory and then its CPU.
            await go(pilot, "g", RanksScreen)
            ranks = app.screen.query_one(RankTable)

            def rank0() -> list[str]:
                return [str(c) for c in ranks.get_row_at(0)] if ranks.row_count else []

            await wait_until(pilot, lambda: rank0()[:3] == ["0", str(worker.pid), "running"] and rank0()[5] != "-")
            assert rank0()[3] == "cpu" and re.fullmatch(r"[\d.]+ (MiB|GiB)", rank0()[4]), rank0()
            # No GPU here: the note says why, with no GPU table or its title left empty above it.
            await wait_until(pilot, lambda: "GPU fields absent" in text_of(app.screen.query_one("#message")))
            assert not app.screen.query_one(GpuTable).display and not app.screen.query_one("#gpus-title").display
            await go(pilot, "d", DashboardScreen)
            header = app.screen.query_one("#run-header")
            await wait_until(pilot, lambda: "now: victim step" in text_of(header))
            assert re.search(r"last update \d+ s ago", text_of(header))
            worker.send_signal(signal.SIGKILL)  # from another process: a failure, not an OOM
            await wait_until(
                pilot,
                lambda: (
                    "victim" in panels(app) and "failed" in text_of(panels(app)["victim"].query_one(".panel-title"))
                ),
                120,
            )
            assert "SIGKILL" in text_of(panels(app)["victim"].query_one(".panel-title"))
            await wait_until(pilot, lambda: "now: survivor step" in text_of(header), 120)
        # The TUI has closed; the run it started goes on.
        assert job.running

    try:
        asyncio.run(scenario())
        job = jobs[0]
        job.stop()
        assert job.process.wait(timeout=120) == 130  # SIGTERM is handled like Ctrl-C
        store = RunStore(job.out_dir)
        survivor = next(s for s in store.strategies(store.run()["id"]) if s["name"] == "survivor")
        assert (survivor["status"], survivor["reason"]) == ("failed", "interrupted by the user")
        assert store.run()["status"] == "interrupted"
    finally:
        for job in jobs:
            if job.running:
                job.process.kill()


@pytest.mark.slow
def test_stop_from_the_runs_screen_ends_a_tune_and_it_cleans_up(tmp_path, nvme_root):
    root = tmp_path / "runs"
    drive = nvme_root / "tui-stop"
    drive.mkdir()

    async def scenario():
        app = make_app(root=root, poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            job = await start_job(pilot, app, "a", str(drive))
            # Points reach the store as the sweep measures them.
            await wait_until(
                pilot,
                lambda: (
                    any(e.kind == "tune" for e in find_runs(root))
                    and RunStore(job.out_dir).conn.execute("SELECT COUNT(*) FROM tune_points").fetchone()[0] > 0
                ),
                120,
            )
            await pilot.press("x")
            code = await asyncio.to_thread(job.process.wait, 120)
            assert code == 130
            assert not job.out_dir.exists()  # the tune removes the output folder it began
            assert list(drive.iterdir()) == []  # and its probe files

    asyncio.run(scenario())


# -- snapshots: fixed numbers written through the store's own API ------------------------------------------------
T0 = 1_764_000_000.0


def _fixed_run(root: Path) -> None:
    (root / "demo").mkdir(parents=True)
    store = RunStore(root / "demo", create_schema=True)
    run_id = store.add_run("demo", "")
    store.conn.execute("UPDATE runs SET created_at = ? WHERE id = ?", (T0, run_id))
    specs = [
        ("zero3-nvme", "deepspeed", "done", None),
        ("fsdp2-cpu-offload", "fsdp2", "does_not_fit", "host RAM exhausted: the worker was killed (SIGKILL)"),
        ("fsdp2", "fsdp2", "running", None),
    ]
    for index, (name, engine, status, reason) in enumerate(specs):
        sid = store.add_strategy(run_id, name, engine, {}, steps_planned=8)
        store.set_strategy_status(sid, status, reason)
        store.add_events(sid, None, [(None, "telemetry_note", T0, None, "GPU fields absent: NVML unavailable (test)")])
        steps = 8 if status == "done" else (3 if status == "running" else 0)
        for step in range(1, steps + 1):
            start = T0 + 10 * index + step
            duration = 0.5 + 0.1 * ((step * 7) % 5)
            store.add_step(
                sid,
                0,
                StepRecord(
                    step,
                    5.0 - 0.1 * step,
                    start,
                    start + duration,
                    1000 / duration,
                    None,
                    None,
                    None,
                    300 << 20,
                    4 << 20,
                    6 << 20,
                ),
            )
            phases = ("forward", "backward", "optimizer")
            marks = [start + duration * share for share in (0.0, 0.2, 0.5, 0.9)]  # and 10% outside the phases
            store.add_events(sid, 0, [(step, k, a, b, None) for k, a, b in zip(phases, marks, marks[1:])])
            if engine == "deepspeed":  # it swaps to NVMe: three quarters of its optimizer phase is the wait
                waited = {"read_bytes": 8 << 20, "write_bytes": 8 << 20, "wait_seconds": 0.3 * duration}
                waited.update(wait_by_phase={"optimizer": 0.3 * duration}, phase="train")
                store.add_events(sid, 0, [(step, SWAP_EVENT, start, start + duration, json.dumps(waited))])
        store.add_samples(
            sid,
            [
                (T0 + 10 * index + i / 2, "disk", "disk.write(B/s)", float((i * 37) % 11) * 1e6)
                for i in range(2 * steps)
            ],
        )
        if status == "done":
            store.set_checkpoint_result(sid, True, "digests match")


def _fixed_tune(root: Path) -> None:
    (root / "tune-demo").mkdir(parents=True)
    store = RunStore(root / "tune-demo", create_schema=True)
    run_id = store.add_run("tune", "")
    store.conn.execute("UPDATE runs SET created_at = ? WHERE id = ?", (T0 - 3600, run_id))
    points = []
    for block in (256 << 10, 1 << 20, 8 << 20):
        for depth in (8, 32, 128):
            for threads in (1, 2):
                read = 1.0 + 0.1 * (block.bit_length() - 18) + 0.002 * depth + 0.05 * threads
                write = 1.5 + 0.05 * (block.bit_length() - 18) + 0.001 * depth
                aio = AioSettings(block_size=block, queue_depth=depth, intra_op_parallelism=threads)
                points.append(
                    TunePoint(
                        aio,
                        "coarse",
                        read,
                        0.02,
                        write,
                        0.03,
                        1,
                        2 * read * write / (read + write),
                        is_deepspeed_default=aio == AioSettings(),
                    )
                )
    best = max(points, key=lambda p: p.score_gbps)
    store.upsert_tune_points(run_id, [dataclasses.replace(p, is_best=p is best) for p in points])
    store.set_run_status(run_id, "done")


@pytest.fixture
def fixed_root(tmp_path):
    root = tmp_path / "runs"
    _fixed_run(root)
    _fixed_tune(root)
    lock = RunDir.at(root / "demo").lock()  # the demo run is live: a process holds its folder, as `run` does
    yield root
    os.close(lock)


def _ready(app, screen_type) -> bool:
    """The screen shows its data and its footer keys: a snapshot taken earlier catches a half-drawn frame."""
    screen = app.screen
    if not isinstance(screen, screen_type) or not screen.query("FooterKey"):
        return False
    if isinstance(screen, DashboardScreen):
        return drawn(app, 3) and screen.query_one(CompareTable).row_count == 3
    if isinstance(screen, TuneScreen):
        return screen.query_one(TuneHeatmap).row_count > 0
    return screen.query_one("#runs", DataTable).row_count == 2


def _then(*keys: str):
    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: _ready(pilot.app, DashboardScreen))
        await pilot.press(*keys)
        target = {(): DashboardScreen, ("t",): TuneScreen, ("r",): RunsScreen}[keys]
        await wait_until(pilot, lambda: _ready(pilot.app, target))
        await pilot.pause()

    return run_before


def _minutes_after_the_last_write(root: Path):
    """A clock 3 minutes after the demo run last recorded anything: "last update 3 min ago" every time."""
    last = RunStore(root / "demo").last_written()
    return lambda: last + 180.0


@pytest.mark.parametrize("keys", [(), ("t",), ("r",)], ids=["dashboard", "tune", "runs"])
def test_snapshots_of_the_main_screens(fixed_root, snap_compare, keys):
    app = make_app(root=fixed_root, poll_s=0.2, clock=_minutes_after_the_last_write(fixed_root))
    assert snap_compare(app, terminal_size=SIZE, run_before=_then(*keys))


def test_snapshot_of_the_dashboard_on_a_large_terminal(fixed_root, snap_compare):
    app = make_app(root=fixed_root, poll_s=0.2, clock=_minutes_after_the_last_write(fixed_root))
    assert snap_compare(app, terminal_size=(140, 48), run_before=_then())


def test_the_reader_works_without_textual(fixed_root):
    view = read_run(fixed_root / "demo")
    assert [s.name for s in view.strategies] == ["zero3-nvme", "fsdp2-cpu-offload", "fsdp2"]
    # 5 steps left at the mean of the steady steps (the first, 0.7 s, left out: 0.9 and 0.6 s)
    assert view.current.name == "fsdp2" and view.current.eta_s == pytest.approx(5 * 0.75)
    assert view.strategies[1].summary.reason.startswith("host RAM exhausted")
    assert json.dumps([e.name for e in find_runs(fixed_root)]) == '["demo", "tune"]'


def test_a_run_folder_removed_while_the_runs_are_listed_is_skipped(tmp_path, monkeypatch):
    """Seen in CI: a stopped tune deletes its folder between find_runs' listing and its read."""
    import shutil

    from offloadlab_tui import reader

    vanishing = tmp_path / "tune-1"
    vanishing.mkdir()
    (vanishing / DB_NAME).write_bytes(b"half-written")
    real_read = reader.read_store

    def read_after_removal(run_dir, read):
        shutil.rmtree(run_dir)
        return real_read(run_dir, read)

    monkeypatch.setattr(reader, "read_store", read_after_removal)
    assert find_runs(tmp_path) == []


def test_only_the_screen_shown_reads_the_store(root):
    """Each mode's screen stays mounted; a hidden one must not re-read a long run's store every poll."""

    async def scenario():
        app = make_app(root=root, poll_s=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: len(panels(app)) == 4)
            dashboard = app.screen
            reads = []
            original = dashboard.read
            dashboard.read = lambda: reads.append(time.monotonic()) or original()
            await wait_until(pilot, lambda: len(reads) >= 2)  # polling while shown
            await go(pilot, "t", TuneScreen)
            await pilot.pause(0.3)
            hidden_since = time.monotonic()
            await pilot.pause(0.6)  # a dozen poll periods
            assert not [t for t in reads if t > hidden_since]
            await go(pilot, "d", DashboardScreen)
            await wait_until(pilot, lambda: any(t > hidden_since for t in reads))

    asyncio.run(scenario())


def test_the_run_given_is_the_first_run_read_and_follow_prefers_the_running_one(fixed_root, monkeypatch):
    """`offloadlab tui RUN_DIR` showed the newest run under ./runs first; following picked the newest
    created run over the one running."""
    from offloadlab_tui import reader

    for name, shift in (("newer", 3600), ("older", -3600)):  # nothing runs these two
        with sqlite3.connect(copy_store(fixed_root / "demo", fixed_root / name) / DB_NAME) as conn:
            conn.execute("UPDATE runs SET created_at = created_at + ?", (shift,))
    read = []
    original = reader.RunReader.read
    monkeypatch.setattr(reader.RunReader, "read", lambda self: read.append(self.run_dir.name) or original(self))

    async def first_run_shown(**where) -> list[str]:
        read.clear()
        app = make_app(root=fixed_root, poll_s=0.05, **where)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: _ready(app, DashboardScreen))
            return list(read)

    assert set(asyncio.run(first_run_shown(run_dir=fixed_root / "older"))) == {"older"}
    assert set(asyncio.run(first_run_shown())) == {"demo"}  # running, though "newer" is newer


def test_the_first_read_begins_with_the_app_and_the_series_follow_it(root, monkeypatch):
    """The run given is read from the moment the app is made, in a thread beside Textual's start; that
    first read leaves the sampled series to a second, made as soon as it is drawn (not a poll later: the
    poll here is a minute)."""
    from offloadlab_tui import reader

    reads = []
    original = reader.RunReader.read

    def read(self):
        view = original(self)
        reads.append((threading.current_thread().name, view))
        return view

    monkeypatch.setattr(reader.RunReader, "read", read)

    async def scenario():
        app = make_app(root=root, run_dir=root / "world1", poll_s=60.0)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: drawn(app, 4), timeout=10)
            return {name: p.view for name, p in panels(app).items()}

    views = asyncio.run(scenario())
    (first_thread, first), (_, second) = reads[:2]
    assert first_thread == "offloadlab-first-read" and first.samples_pending and not second.samples_pending
    whole = {s.name: s for s in read_run(root / "world1").strategies}  # a read of everything at once
    assert any(s.host_cpu_percent.values for s in whole.values())
    for strategy in first.strategies:
        assert not strategy.host_cpu_percent.values
        assert views[strategy.name].host_cpu_percent == whole[strategy.name].host_cpu_percent


@pytest.mark.parametrize("key", ["q", "ctrl+c"])
def test_q_during_the_first_read_stops_it(fixed_root, monkeypatch, key):
    """The read begun with the app ends when the app quits, by q or Ctrl-C (Textual's own Ctrl-C only says
    to press q): Python waits for its thread before the process exits (here the read waits for its stop,
    as a long statement ends at its next step). Its store, which no screen took, is closed."""
    from offloadlab_tui import reader

    stopped, closed = threading.Event(), threading.Event()

    def read(self):
        stopped.set() if self.stop.wait(10) else None
        raise ReaderError("interrupted")

    monkeypatch.setattr(reader.RunReader, "read", read)
    monkeypatch.setattr(reader.RunReader, "close", lambda self: closed.set())

    async def scenario():
        app = make_app(root=fixed_root, run_dir=fixed_root / "demo")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.2)
            start = time.monotonic()
            await pilot.press(key)
        return time.monotonic() - start

    assert asyncio.run(scenario()) < 1.0 and stopped.is_set()
    assert closed.wait(1.0)


def test_the_comparison_table_stays_scrolled_across_polls(fixed_root):
    """At 80 columns most of the table is off to the right; each poll used to clear and refill it, snapping
    a user's scroll back to the left every second."""

    async def scenario():
        app = make_app(root=fixed_root, poll_s=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: _ready(app, DashboardScreen))
            table = app.screen.query_one(CompareTable)
            table.scroll_to(x=40, animate=False)
            await pilot.pause(0.1)
            assert table.scroll_x == 40
            await pilot.pause(0.5)  # ten polls
            assert table.scroll_x == 40 and table.row_count == 3

    asyncio.run(scenario())


def test_the_running_strategy_comes_first_and_question_mark_lists_the_keys(fixed_root):
    """At 80x24 one panel fits: the running strategy's used to sit below the finished ones, off-screen.
    Finished ones open from the table."""

    async def scenario():
        app = make_app(root=fixed_root, poll_s=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: _ready(app, DashboardScreen))
            assert [p.strategy_name for p in panels(app).values()][0] == "fsdp2"  # running; third in the spec
            # The others fold into their table row until the table's cursor is on it.
            shown = lambda: [name for name, p in panels(app).items() if p.display]  # noqa: E731
            assert shown() == ["fsdp2"]
            app.screen.query_one(CompareTable).focus()
            await wait_until(pilot, lambda: shown() == ["fsdp2", "zero3-nvme"])  # the cursor's first row
            await pilot.press("down")
            await wait_until(pilot, lambda: shown() == ["fsdp2", "fsdp2-cpu-offload"])
            # Below the running one's panel it would be off-screen: it is scrolled to.
            box, opened = app.screen.query_one("#panels"), panels(app)["fsdp2-cpu-offload"]
            await wait_until(pilot, lambda: box.region.contains_point(opened.region.offset))
            app.screen.query_one("#panels").focus()
            await wait_until(pilot, lambda: shown() == ["fsdp2"])
            # No NVML here: the GPU's series are left out, not drawn flat.
            assert not panels(app)["fsdp2"].query_one("#m-tx").display
            # Seconds of steps in a 10-minute window: the sparklines spread those, and the line says so.
            windows = panels(app)["fsdp2"].query_one(".windows")
            assert re.search(r"sampled: \d+ s in a 10 min window \(w\)", text_of(windows)), text_of(windows)
            await pilot.press("w")
            await wait_until(pilot, lambda: "in a 1 h window (w)" in text_of(windows))
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: bool(app.screen.query("HelpPanel")))
            await pilot.pause()
            console = Console(record=True, width=80, file=io.StringIO())
            console.print(app.screen.query_one("HelpPanel").query_one("BindingsTable").render())
            listed = console.export_text()
            assert all(word in listed for word in ("Dashboard", "Tune", "Runs", "Quit")), listed
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: not app.screen.query("HelpPanel"))

    asyncio.run(scenario())


def test_a_closed_terminal_ends_the_tui_within_a_second(fixed_root):
    """SIGHUP, as a terminal that closes sends, during the dashboard's reads."""
    import pty

    pid, terminal = pty.fork()
    if pid == 0:  # the child: the TUI on the pseudo-terminal
        os.execv(
            sys.executable,
            [sys.executable, "-c", "from offloadlab_tui.app import main; main()", str(fixed_root / "demo")],
        )
    try:
        deadline = time.monotonic() + 30
        seen = b""
        while b"zero3-nvme" not in seen and time.monotonic() < deadline:  # the dashboard is drawn
            seen += os.read(terminal, 65536)
        assert b"zero3-nvme" in seen
        os.kill(pid, signal.SIGHUP)
        sent = time.monotonic()
        while not os.waitpid(pid, os.WNOHANG)[0]:
            assert time.monotonic() - sent < 1.0, "the TUI outlived its terminal by a second"
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(terminal)


@pytest.mark.parametrize("size", [SIZE, (140, 48)])
def test_panels_hold_each_peak_against_the_gpu_budget_the_ram_the_link_and_the_plan(tmp_path, size):
    """An H200 run held to 24 GiB (bench/results/2026-12-04-h200-s12), with the plan made for it on the same
    machine attached as `run --plan` attaches one: the GPU's reserve is shown against the budget, not the
    140 GiB card; the process tree's RSS against the host's RAM; PCIe against the link the plan measured;
    the step against the plan's."""
    run_dir, planned = h200_budget_run_with_its_plan(tmp_path)
    expected = {s.name: s for s in summarize(RunStore(run_dir))}

    async def scenario():
        app = make_app(root=tmp_path, run_dir=tmp_path / "b24", poll_s=0.2)
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: drawn(app, 3))
            for name in ("zero3-opt-cpu", "fsdp2-cpu-dsadam"):
                s = expected[name]
                gpu = f"{s.peak_reserved_bytes / s.gpu_budget_bytes:.0%}"
                ram = f"{s.host_rss_peak_bytes / s.host_memory_bytes:.0%}"
                to_gpu, to_host = s.pcie_rx_bytes_per_s / 1e9, s.pcie_tx_bytes_per_s / 1e9
                link = planned[name].pcie_link_gbps
                assert link[0] > 50  # the H200 machine's pinned copies, as the plan measured them
                assert text_of(panels(app)[name].query_one(".capacity")) == (
                    f"GPU {human_bytes(s.peak_reserved_bytes)} {gpu} of 24.0 GiB budget · "
                    f"RSS {human_bytes(s.host_rss_peak_bytes)} {ram} of {human_bytes(s.host_memory_bytes)} RAM · "
                    f"PCIe h2d/d2h {to_gpu:.1f} / {to_host:.1f} GB/s, "
                    f"{to_gpu / link[0]:.0%} / {to_host / link[1]:.0%} of link · "
                    f"step {s.mean_step_time_s / planned[name].step_s:.2f}x the plan's {planned[name].step_s:.3g} s"
                )
            # FSDP2 without offload ran out of the budget before a step: no peaks to hold against anything.
            assert not panels(app)["fsdp2"].query_one(".capacity").display

    asyncio.run(scenario())


def test_the_tune_screen_keeps_deepspeeds_default_in_view(tmp_path):
    """An H200 quick tune (session 12) whose DeepSpeed default ranks 26th of 48 and loses its cell to a
    better single_submit/overlap_events variant: it used to appear nowhere on the screen."""
    with tarfile.open(REPO / "bench/results/2026-12-04-h200-s12/zero3-nvme-tuned.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    tune_dir = tmp_path / "zero3-nvme-tuned/work/tune"
    store = RunStore(tune_dir)
    points = store.tune_points(store.run()["id"])
    default = next(p for p in points if p.is_deepspeed_default)
    assert points.index(default) >= 8  # not among the leading points

    async def scenario():
        app = make_app(root=tmp_path, run_dir=tune_dir, poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await go(pilot, "t", TuneScreen)
            heatmap = app.screen.query_one(TuneHeatmap)
            await wait_until(pilot, lambda: heatmap.row_count > 0)
            while app.screen.threads != default.aio.intra_op_parallelism:
                await pilot.press("right_square_bracket")
            row = next(r for r in range(heatmap.row_count) if str(heatmap.get_row_at(r)[0]) == "1M")
            depths = [str(c.label) for c in heatmap.columns.values()]
            cell = str(heatmap.get_row_at(row)[depths.index(str(default.aio.queue_depth))])
            assert cell.strip().endswith("d"), cell
            top = app.screen.query_one("#top-points", DataTable)
            labels = [str(top.get_row_at(r)[0]) for r in range(top.row_count)]
            assert top.row_count == 8 and labels[-1].startswith("bs=1M qd=8 t=1 ss=0 ov=1"), labels

    asyncio.run(scenario())


def test_the_gpus_and_ranks_view_shows_each_gpus_newest_sample_and_each_rank_as_a_process(fixed_root):
    """Two GPUs' samples as the sampler writes them; rank 0 recorded this test's own process (alive here),
    rank 1 one on another host, which cannot be looked at from here."""
    import socket

    store = RunStore(fixed_root / "demo", writable=True)
    sid = store.strategy_id(store.run()["id"], "fsdp2")
    fields = {"util(%)": (40.0, 95.0), "mem_used(B)": (30 * 2**30, 70 * 2**30), "pcie_tx(B/s)": (2e9, 3e9)}
    rows = [
        (T0 + 40 + t, "gpu", f"gpu{i}.{name}", values[i] + t)  # the newest sample is the one shown
        for t in (0, 1)
        for i in (0, 1)
        for name, values in fields.items()
    ]
    store.add_samples(sid, rows)
    facts = dict(n_params=1, n_layers=1, d_model=1, seq_len=1, precision="bf16", device_name="H100")
    facts.update(world_size=2, gpu_memory_bytes=80 * 2**30)
    processes_ = [(0, os.getpid(), socket.gethostname()), (1, 4242, "elsewhere")]
    store.add_events(sid, 0, [(None, "model", T0, T0, json.dumps(facts))])
    for rank, pid, host in processes_:
        process = dict(pid=pid, host=host, local_rank=rank, device=f"cuda:{rank}", cpu_cores=[2 * rank, 2 * rank + 1])
        store.add_events(sid, rank, [(None, "rank_process", time.time(), None, json.dumps(process))])
    store.close()

    async def scenario():
        app = make_app(root=fixed_root, run_dir=fixed_root / "demo", poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await go(pilot, "g", RanksScreen)
            gpus, ranks = app.screen.query_one(GpuTable), app.screen.query_one(RankTable)
            await wait_until(pilot, lambda: gpus.row_count == 2 and ranks.row_count == 2)
            assert app.screen.query_one("#gpus-title").display
            gpu1 = [str(c) for c in gpus.get_row_at(1)]
            assert gpu1[1].endswith("96%") and gpu1[1].startswith("█" * 8)  # util 95 + 1
            assert gpu1[2].endswith("88%") and gpu1[3] == "70.0/80.0 GiB"
            assert gpu1[4].startswith("3.00/")
            here, there = ([str(c) for c in ranks.get_row_at(i)] for i in (0, 1))
            assert here[:4] == ["0", str(os.getpid()), "running", "cuda:0"]
            assert re.fullmatch(r"[\d.]+ (MiB|GiB)", here[4]), here
            assert there[:3] == ["1", "4242", "on elsewhere"] and there[4] == "-"
            await wait_until(pilot, lambda: str(ranks.get_row_at(0)[5]) != "-")  # CPU from the second look on

    asyncio.run(scenario())


def test_the_gpus_view_names_a_strategy_whose_run_process_went_failed(tmp_path):
    """As the dashboard and compare do: a strategy that says running in a run no process holds (killed)
    failed. The GPUs screen's title said "fsdp2 (running)" beside a dashboard that said it failed."""
    from offloadlab_tui.ranks import RanksReader

    _fixed_run(tmp_path)
    dead = RanksReader(tmp_path / "demo").read()
    lock = RunDir.at(tmp_path / "demo").lock()
    try:
        live = RanksReader(tmp_path / "demo").read()
    finally:
        os.close(lock)
    assert dead.strategy == live.strategy == "fsdp2"
    assert dead.status is Status.FAILED and live.status is Status.RUNNING


def test_a_status_this_version_does_not_write_reads_as_unknown(tmp_path):
    """A store with status 'bogus' (a newer version's, or hand-edited) crashed compare, report and the TUI at
    start with "ValueError: 'bogus' is not a valid Status"."""
    from conftest import write_spec
    from offloadlab.run.runner import spec_toml
    from offloadlab.spec import load_spec

    spec = load_spec(write_spec(tmp_path, [dict(name="fsdp2", engine="fsdp2")]))
    run_dir = tmp_path / "runs" / "edited"
    run_dir.mkdir(parents=True)
    store = RunStore(run_dir, create_schema=True)
    run_id = store.add_run(spec.name, spec_toml(spec))
    store.add_strategy(run_id, "fsdp2", "fsdp2", spec.strategy[0].model_dump(mode="json"), spec.steps)
    store.conn.execute("UPDATE strategies SET status = 'bogus'")
    store.conn.execute("UPDATE runs SET status = 'bogus'")
    store.close()
    for args in (["compare", str(run_dir)], ["compare", str(run_dir), "--json"]):
        assert "unknown" in cli(*args).stdout
    cli("report", str(run_dir))
    assert "<td>unknown (0/4)</td>" in (run_dir / "report.html").read_text()

    async def scenario():
        app = make_app(root=tmp_path / "runs", poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "fsdp2" in panels(app))
            assert panels(app)["fsdp2"].view.summary.status == "unknown"
        assert app.return_code in (0, None)

    asyncio.run(scenario())


def test_a_verify_after_the_last_step_is_shown_and_an_interrupted_one_is_not_counted_finished(tmp_path, world1):
    """At a billion parameters the checkpoint's verify takes minutes after the last step: the panel read
    "step 4 of 4, ETA 0:00" all that time. Once its run died, the strategy it stopped counted as finished."""

    run_dir = copy_store(world1, tmp_path / "runs" / "verifying")
    store = RunStore(run_dir, writable=True)
    run_id = store.run()["id"]
    store.set_run_status(run_id, Status.RUNNING)
    store.set_strategy_status(store.strategy_id(run_id, "fsdp2"), Status.RUNNING)  # its verify launched last
    total = len(store.strategies(run_id))
    store.close()
    held = RunDir(run_dir).lock()  # as `offloadlab run` holds it

    async def scenario():
        nonlocal held
        app = make_app(root=tmp_path / "runs", poll_s=0.2)
        async with app.run_test(size=SIZE) as pilot:
            header = app.screen.query_one("#run-header")
            await wait_until(pilot, lambda: "fsdp2" in panels(app))
            title = text_of(panels(app)["fsdp2"].query_one(".panel-title"))
            assert re.search(r"step (\d+) of \1, verifying checkpoint", title), title
            assert "verifying checkpoint" in text_of(header) and f"{total - 1}/{total} strategies finished" in (
                text_of(header)
            )
            os.close(held)  # the run's process died
            held = None
            await wait_until(pilot, lambda: "interrupted" in text_of(header))
            assert f"{total - 1}/{total} strategies finished" in text_of(header)
            assert "verifying" not in text_of(panels(app)["fsdp2"].query_one(".panel-title"))
        assert app.return_code in (0, None)

    try:
        asyncio.run(scenario())
    finally:
        if held is not None:
            os.close(held)
    listed = cli("compare", str(tmp_path / "runs")).stdout
    assert f"{total - 1}/{total}" in listed and "interrupted" in listed


def test_a_line_that_keeps_its_rows_is_shown_without_laying_the_screen_out():
    """A running strategy's step count and ETA change every poll: the line is shown in place while it keeps
    its rows, and the screen is laid out again only when a line is added or one may wrap."""
    from textual.app import App

    from offloadlab_tui.widgets import _may_change_rows, show_content

    class OneLine(App):
        CSS = "Static { width: 30; height: auto; }"

        def compose(self):
            yield Static("step 1 of 40", id="line")

    async def scenario():
        app = OneLine()
        async with app.run_test(size=(80, 10)) as pilot:
            line = app.query_one("#line", Static)
            assert not _may_change_rows(line, "step 2 of 40, ETA 0:01")
            assert _may_change_rows(line, "step 2 of 40\nnow: zero2-cpu")
            assert _may_change_rows(line, "x" * 30)
            show_content(line, "y" * 45)  # wraps: two rows
            await pilot.pause()
            assert line.size.height == 2
            show_content(line, "step 3 of 40")  # from a wrapped line back to one row
            await pilot.pause()
            assert line.size.height == 1 and str(line.content) == "step 3 of 40"

    asyncio.run(scenario())


def test_a_read_ends_at_its_next_sql_step_once_its_screen_closes(fixed_root):
    """q during a long first read: Python waits for a running thread before it exits, so the read itself
    must end. Set while a statement runs (a count to a billion, a minute and more), the stop ends it."""
    from offloadlab_tui.reader import read_store

    run_dir = next(p for p in fixed_root.iterdir() if (p / DB_NAME).exists())
    stop = threading.Event()

    def read(store):
        threading.Timer(0.2, stop.set).start()
        count = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1e9) SELECT COUNT(*) FROM c"
        return store.conn.execute(count).fetchone()

    start = time.perf_counter()
    with pytest.raises(ReaderError, match="interrupted"):
        read_store(run_dir, read, stop)
    assert time.perf_counter() - start < 1.0


def test_the_table_is_redrawn_whole_when_a_strategy_starts_or_ends_not_as_one_runs(fixed_root):
    """A running row's figures are dashes, its "bound by" too (the panel's phase bar has it live): each poll
    of a live run redrew the whole screen for that one cell, most of the poll's CPU."""
    from textual.app import App

    from offloadlab.results.status import Status
    from offloadlab_tui.widgets import CompareTable

    view = read_run(next(p for p in fixed_root.iterdir() if p.name == "demo"))
    first = view.strategies[0]

    def running(phase_seconds: dict) -> object:
        summary = dataclasses.replace(first.summary, status=Status.RUNNING, phase_seconds=phase_seconds)
        return dataclasses.replace(view, strategies=[dataclasses.replace(first, summary=summary)])

    class OneTable(App):
        def compose(self):
            yield CompareTable()

    async def scenario():
        app = OneTable()
        async with app.run_test(size=(200, 10)):
            table = app.query_one(CompareTable)
            assert table.show(running({"forward": 1.0, "backward": 2.0, "optimizer": 3.0}))  # the row came
            assert table.get_cell(first.name, "bound by") == "-"
            assert not table.show(running({"forward": 1.0, "backward": 2.0, "optimizer": 9.0}))
            assert table.show(dataclasses.replace(view, strategies=[first]))  # it ended
            assert table.get_cell(first.name, "bound by") != "-"

    asyncio.run(scenario())


def test_a_store_replaced_between_polls_is_read_anew(tmp_path, fixed_root, world1):
    """The dashboard's reader keeps its store open between polls; a file put in its place (a run folder
    reused) is another file, and the next poll opens and reads it."""
    from offloadlab_tui.reader import RunReader

    run_dir = copy_store(world1, tmp_path / "run")
    reader = RunReader(run_dir)
    assert len(reader.read().strategies) == 4
    demo = copy_store(fixed_root / "demo", tmp_path / "demo")
    os.replace(demo / DB_NAME, run_dir / DB_NAME)
    assert [s.name for s in reader.read().strategies] == [s.name for s in read_run(fixed_root / "demo").strategies]
    reader.close()


def test_a_poll_interval_that_would_spin_or_never_draw_is_refused_by_both_entry_points(capsys):
    """0, a negative or a NaN interval left a blank screen spinning a core; `offloadlab tui` passes --poll on."""
    from offloadlab_tui.app import main

    for value in ("0", "-1", "nan", "abc"):
        with pytest.raises(SystemExit) as refused:
            main(["--poll", value])
        assert refused.value.code == 2 and "--poll" in capsys.readouterr().err
    proc = cli("tui", "--poll", "0", check=False)
    assert proc.returncode == 2 and "--poll" in proc.stdout + proc.stderr


def test_a_single_value_is_drawn_flat_as_a_constant_series():
    """A 1-hour window of a strategy that ran for seconds is one 10-s bin: Textual drew one value as full
    bars, a peak above "0.00 GB/s" (a new user's trial), while a constant series is a flat line."""
    from textual.app import App

    from offloadlab_tui.reader import Series
    from offloadlab_tui.widgets import MetricSpark

    class OneMetric(App):
        def compose(self):
            yield MetricSpark("disk read")

    async def scenario() -> dict[int, set[str]]:
        app = OneMetric()
        drawn = {}
        async with app.run_test(size=(40, 6)) as pilot:
            metric = app.query_one(MetricSpark)
            for values in ([7.0], [7.0] * 3):
                metric.show(Series(values, 7.0), lambda v: f"{v:.1f}", finished=True)
                await pilot.pause()
                console = Console(record=True, width=20, file=io.StringIO())
                console.print(metric.spark.render())
                drawn[len(values)] = set(console.export_text().strip())
        return drawn

    assert asyncio.run(scenario()) == {1: {"▁"}, 3: {"▁"}}


def test_a_step_times_range_fits_a_quarter_of_80_columns():
    """Steps of 20 s read "19.000 .. 21.000…", cut in the panel's 17-column cells at 80 columns."""
    from textual.app import App

    from offloadlab_tui.reader import Series
    from offloadlab_tui.widgets import MetricSpark, step_seconds

    class OneMetric(App):
        def compose(self):
            yield MetricSpark("step time")

    async def scenario() -> list[str]:
        app = OneMetric()
        async with app.run_test(size=(40, 6)) as pilot:
            metric, shown = app.query_one(MetricSpark), []
            for values in ([19.0, 21.0], [0.205, 0.63]):
                metric.show(Series(values, values[-1]), step_seconds, finished=False)
                await pilot.pause()
                shown.append(text_of(metric.range))
        return shown

    ranges = asyncio.run(scenario())
    assert ranges == ["19.0 .. 21.0 s", "0.205 .. 0.630 s"] and all(len(r) <= 17 for r in ranges)
