"""What the TUI shows, read from run stores: plain dataclasses, no Textual, usable from any script.

Every read opens the database afresh, so a run store written by another process is followed live (WAL
readers see each committed batch) and a database deleted or replaced under the TUI is noticed at once.
Nothing here writes.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from offloadlab.results.rundir import DB_NAME
from offloadlab.results.status import Status
from offloadlab.results.store import RunStore, StoreError, TunePoint
from offloadlab.results.summary import StrategySummary, summarize

TUNE_RUN_NAME = "tune"


class ReaderError(Exception):
    """A run directory that cannot be shown; the message says why, for the screen."""


@dataclass(frozen=True)
class StrategyView:
    summary: StrategySummary
    step_times_s: list[float]
    tokens_per_s: list[float]
    gpu_allocated_bytes: list[float]
    """Peak allocated bytes of each step (rank 0); empty without a GPU."""
    pcie_tx_bytes_per_s: list[float]
    pcie_rx_bytes_per_s: list[float]
    disk_read_bytes_per_s: list[float]
    disk_write_bytes_per_s: list[float]
    telemetry_notes: list[str]
    """Why some fields are absent (no NVML, no block device), as the sampler recorded it."""
    eta_s: float | None

    @property
    def name(self) -> str:
        return self.summary.name

    @property
    def gpu_absent(self) -> bool:
        """The sampler found no GPU (no NVML, no device): GPU panels say so instead of waiting for data."""
        return any(n.startswith("GPU fields absent") for n in self.telemetry_notes)


@dataclass(frozen=True)
class RunView:
    run_dir: Path
    name: str
    status: Status
    created_at: float
    strategies: list[StrategyView]
    last_written: float = 0.0
    """When the run last recorded a step or a strategy's start or end (the store's clock)."""

    @property
    def current(self) -> StrategyView | None:
        return next((s for s in self.strategies if s.summary.status is Status.RUNNING), None)


@dataclass(frozen=True)
class TuneView:
    run_dir: Path
    status: Status
    created_at: float
    points: list[TunePoint]
    """Best score first."""


@dataclass(frozen=True)
class RunEntry:
    path: Path
    name: str
    kind: str
    """'run' or 'tune'."""
    status: str
    """The run's Status, or why its store cannot be read."""
    created_at: float
    strategies_done: int
    strategies_total: int


def _open(run_dir: Path) -> RunStore:
    if not (Path(run_dir) / DB_NAME).is_file():
        raise ReaderError(f"{run_dir}: no run store ({DB_NAME}) here, or it was deleted")
    try:
        return RunStore(run_dir)  # read-only: the TUI never writes a store or creates a file beside it
    except StoreError as err:
        raise ReaderError(str(err)) from err


def _read(run_dir: Path, read):
    store = _open(run_dir)
    try:
        return read(store)
    except LookupError as err:
        raise ReaderError(str(err)) from err
    except sqlite3.DatabaseError as err:  # corrupt pages, or tables missing: not our schema
        raise ReaderError(f"{run_dir}: {DB_NAME} is not a readable offloadlab run store ({err})") from err
    finally:
        store.close()


def _summed_by_time(rows: list[tuple[float, str, float | None]]) -> list[float]:
    """One value per sample time, summed over GPUs (or devices) sampled at that time."""
    by_time: dict[float, float] = {}
    for t, _, value in rows:
        if value is not None:
            by_time[t] = by_time.get(t, 0.0) + value
    return [by_time[t] for t in sorted(by_time)]


def _eta(summary: StrategySummary, step_times: list[float]) -> float | None:
    if summary.status is not Status.RUNNING or not step_times:
        return None
    return statistics.median(step_times) * max(0, summary.steps_planned - summary.steps_done)


def _strategy_view(store: RunStore, strategy_id: int, summary: StrategySummary) -> StrategyView:
    steps = store.steps(strategy_id, rank=0)
    step_times = [r.step_time_s for r in steps]
    notes = [row["detail"] for row in store.events(strategy_id, "telemetry_note")]
    return StrategyView(
        summary=summary,
        step_times_s=step_times,
        tokens_per_s=[r.tokens_per_s for r in steps],
        gpu_allocated_bytes=[float(r.peak_allocated_bytes) for r in steps if r.peak_allocated_bytes is not None],
        pcie_tx_bytes_per_s=_summed_by_time(store.samples(strategy_id, "gpu%.pcie_tx(B/s)")),
        pcie_rx_bytes_per_s=_summed_by_time(store.samples(strategy_id, "gpu%.pcie_rx(B/s)")),
        disk_read_bytes_per_s=_summed_by_time(store.samples(strategy_id, "disk.read(B/s)")),
        disk_write_bytes_per_s=_summed_by_time(store.samples(strategy_id, "disk.write(B/s)")),
        telemetry_notes=notes,
        eta_s=_eta(summary, step_times),
    )


def read_run(run_dir: Path) -> RunView:
    def read(store: RunStore) -> RunView:
        run = store.run()
        ids = {row["name"]: row["id"] for row in store.strategies(run["id"])}
        views = [_strategy_view(store, ids[s.name], s) for s in summarize(store)]
        return RunView(Path(run_dir), run["name"], store.run_status(), run["created_at"], views, store.last_written())

    return _read(run_dir, read)


def read_tune(run_dir: Path) -> TuneView:
    def read(store: RunStore) -> TuneView:
        run = store.run()
        return TuneView(Path(run_dir), store.run_status(), run["created_at"], store.tune_points(run["id"]))

    return _read(run_dir, read)


def _entry(run_dir: Path) -> RunEntry | None:
    def read(store: RunStore) -> RunEntry:
        run = store.run()
        strategies = store.strategies(run["id"])
        finished = sum(1 for s in strategies if Status(s["status"]).finished)
        kind = "tune" if run["name"] == TUNE_RUN_NAME else "run"
        return RunEntry(run_dir, run["name"], kind, store.run_status(), run["created_at"], finished, len(strategies))

    try:
        return _read(run_dir, read)
    except ReaderError as err:
        try:
            return RunEntry(run_dir, run_dir.name, "?", f"unreadable: {err}", run_dir.stat().st_mtime, 0, 0)
        except FileNotFoundError:
            return None  # removed while being listed (a stopped tune deletes its folder): not a run any more


def find_runs(root: Path) -> list[RunEntry]:
    """Run directories directly under `root` (and `root` itself if it is one), newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    candidates = [root, *sorted(p for p in root.iterdir() if p.is_dir())]
    entries = [e for e in (_entry(p) for p in candidates if (p / DB_NAME).is_file()) if e is not None]
    return sorted(entries, key=lambda e: e.created_at, reverse=True)


def latest(root: Path, kind: str) -> Path | None:
    return next((e.path for e in find_runs(root) if e.kind == kind), None)


def when(created_at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(created_at))
