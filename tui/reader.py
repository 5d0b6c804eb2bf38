"""What the TUI shows, read from run stores: plain dataclasses, no Textual, usable from any script.

Every read opens the database afresh, so a run store written by another process is followed live (WAL
readers see each committed batch) and a database deleted or replaced under the TUI is noticed at once.
Nothing here writes.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from offloadlab.results.figures import RANK_PROCESS_EVENT, steady_state
from offloadlab.results.rundir import DB_NAME
from offloadlab.results.status import Status, ran_to_its_end
from offloadlab.results.steps import TELEMETRY_NOTE
from offloadlab.results.store import BIN_WIDTHS_S, RunStore, StoreError, TunePoint, read_only_mode, runs_in
from offloadlab.results.summary import StrategySummary, SummaryCache, summarize

TUNE_RUN_NAME = "tune"


class ReaderError(Exception):
    """A run directory that cannot be shown; the message says why, for the screen."""


WINDOW_STEPS = 120
"""Per-step sparklines show the last this many steps."""
WINDOWS_S = (600.0, 3600.0, 6 * 3600.0)
"""What sampled sparklines (PCIe, disk, CPU) can show: the last this many seconds (`w` cycles). The first
is drawn from the samples, longer ones from the stored 10-s bins."""
WINDOW_S = WINDOWS_S[0]
RECOMPUTE_SHARE = 0.0025
"""The share of a core the running strategy's figures over all its steps may take (SummaryCache)."""


@dataclass(frozen=True)
class Series:
    """One panel metric: the values of the window shown, and the figure printed beside them."""

    values: list[float]
    figure: float | None
    """The latest value while the strategy runs; once it has finished, its steady-state figure (a mean over
    its steady steps), not whatever the last sample happened to be."""

    @classmethod
    def of(cls, values: list[float], finished: bool, steady: float | None) -> "Series":
        return cls(values, steady if finished else values[-1] if values else None)


@dataclass(frozen=True)
class StrategyView:
    summary: StrategySummary
    step_time_s: Series
    tokens_per_s: Series
    gpu_allocated_bytes: Series
    """Peak allocated bytes of each step (rank 0); empty without a GPU."""
    pcie_tx_bytes_per_s: Series
    pcie_rx_bytes_per_s: Series
    disk_read_bytes_per_s: Series
    disk_write_bytes_per_s: Series
    host_cpu_percent: Series
    """All cores together, as the sampler reads psutil's cpu_percent (100% a core)."""
    telemetry_notes: list[str]
    """Why some fields are absent (no NVML, no block device), as the sampler recorded it."""
    eta_s: float | None
    stage: str | None
    """What a running strategy does once its steps are done ("verifying checkpoint"), else None."""
    window_s: float
    """The sampled series' window (seconds); the per-step ones show the last WINDOW_STEPS steps."""
    stepped_s: float
    """From the first step's start to the last one's end: less than window_s, the sparklines spread that
    time, not the window, over their width."""

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
    samples_pending: bool = False
    """The sampled series are left to the next read (the first one's)."""

    @property
    def current(self) -> StrategyView | None:
        return next((s for s in self.strategies if s.summary.status is Status.RUNNING), None)

    @property
    def eta(self) -> tuple[float, int] | None:
        """(seconds until the run ends, strategies left out of that for want of a step time) while it runs:
        the running strategy's ETA, and each pending one's steps at the plan's step time (`run --plan`)."""
        if self.current is None:
            return None
        seconds, unknown = self.current.eta_s or 0.0, 0
        for s in self.strategies:
            if s.summary.status is Status.PENDING:
                planned = s.summary.planned.step_s if s.summary.planned else None
                seconds += (planned or 0.0) * s.summary.steps_planned
                unknown += not planned
        return seconds, unknown


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


PROGRESS_STEPS = 100_000
"""SQLite's virtual-machine steps between checks of a read's stop: about a millisecond of its work. Each
check takes the GIL from the screen's thread, so not every thousand."""


def _open(run_dir: Path, stop: threading.Event | None = None) -> RunStore:
    """The run's store, opened read-only; once `stop` is set its statements end (see read_store)."""
    if not (Path(run_dir) / DB_NAME).is_file():
        if runs_in(Path(run_dir)):  # a folder of runs given as one (a new user's `offloadlab tui runs/`)
            raise ReaderError(
                f"{run_dir} is a folder of runs, not one: `offloadlab tui --root {run_dir}` follows the newest"
            )
        raise ReaderError(f"{run_dir}: no run store ({DB_NAME}) here, or it was deleted")
    try:
        store = RunStore(run_dir)  # read-only: the TUI never writes a store or creates a file beside it
    except StoreError as err:
        raise ReaderError(str(err)) from err
    if stop is not None:
        store.conn.set_progress_handler(stop.is_set, PROGRESS_STEPS)
    return store


def read_store(run_dir: Path, read, stop: threading.Event | None = None, kept: KeptStore | None = None):
    """read(store) on the run's store, opened read-only for it (or kept open between reads by `kept`).
    Once `stop` is set, the SQL statement running and every later one end within a thousand of SQLite's
    steps: a screen that closes (q, Ctrl-C) ends its read instead of waiting for it (a thread cannot be
    cancelled, and Python waits for it before the process exits: a day-long store's first read kept q
    waiting 0.9 s)."""
    store = kept.store(stop) if kept is not None else _open(run_dir, stop)
    try:
        return read(store)
    except LookupError as err:
        raise ReaderError(str(err)) from err
    except sqlite3.DatabaseError as err:  # corrupt pages, or tables missing: not our schema
        if kept is not None:
            kept.close()
        raise ReaderError(f"{run_dir}: {DB_NAME} is not a readable offloadlab run store ({err})") from err
    finally:
        if kept is None:
            store.close()


class KeptStore:
    """A run's store kept open between one screen's polls: opening it was 4 ms of a 12-ms poll. It is
    opened again when the file is another (deleted, replaced) or must be opened another way (its run ended,
    or its WAL came or went: store.read_only_mode), so a poll still sees what a fresh open would."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._open: tuple[RunStore, tuple] | None = None

    def store(self, stop: threading.Event | None) -> RunStore:
        path = self.run_dir / DB_NAME
        try:
            found = path.stat()
        except OSError:
            found = None
        identity = found and (found.st_dev, found.st_ino, read_only_mode(path))
        if self._open is None or self._open[1] != identity:
            self.close()
            # _open names what is wrong with a file that is missing or not a store
            self._open = (_open(self.run_dir, stop), identity)
        return self._open[0]

    def close(self) -> None:
        if self._open is not None:
            self._open[0].close()
            self._open = None


def _summed_by_time(rows: list[tuple[float, str, float | None]]) -> list[tuple[float, float]]:
    """One (time, value) per sample time, summed over GPUs (or devices) sampled at that time."""
    by_time: dict[float, float] = {}
    for t, _, value in rows:
        if value is not None:
            by_time[t] = by_time.get(t, 0.0) + value
    return sorted(by_time.items())


def _eta(summary: StrategySummary) -> float | None:
    """The steps left at the mean steady step (stalls included: a median was 4x optimistic on ZenFlow)."""
    if summary.status is not Status.RUNNING or summary.mean_step_time_s is None:
        return None
    return summary.mean_step_time_s * max(0, summary.steps_planned - summary.steps_done)


SAMPLED = {
    "pcie_tx_bytes_per_s": "gpu%.pcie_tx(B/s)",
    "pcie_rx_bytes_per_s": "gpu%.pcie_rx(B/s)",
    "disk_read_bytes_per_s": "disk.read(B/s)",
    "disk_write_bytes_per_s": "disk.write(B/s)",
    "host_cpu_percent": "host.cpu(%)",
}


class SampleWindow:
    """The last `window_s` seconds of one sampled series of a running strategy. The first window is kept
    between polls (each reads only the samples taken since the last); a longer one is read from the
    stored 10-s bins, whose newest is still filling."""

    def __init__(self, pattern: str, window_s: float):
        self.pattern, self.window_s = pattern, window_s
        self.summed: list[tuple[float, float]] = []
        """(time, value summed over the GPUs sampled then): each poll adds only the times since the last
        (a sample time's rows are written together, so none is split between two reads)."""

    def update(self, store: RunStore, strategy_id: int) -> list[float]:
        if self.window_s > WINDOW_S:
            newest = store.newest_sample_t(strategy_id)
            binned = store.binned_sums(strategy_id, self.pattern, newest - self.window_s, newest + BIN_WIDTHS_S[0])
            if binned is not None:
                return binned
        after = self.summed[-1][0] if self.summed else store.newest_sample_t(strategy_id) - self.window_s
        self.summed += _summed_by_time(store.samples(strategy_id, self.pattern, after_t=after))
        if self.summed:
            start = self.summed[-1][0] - self.window_s
            del self.summed[: bisect.bisect_right(self.summed, start, key=lambda row: row[0])]
        return [v for _, v in self.summed]


def _finished_series(store: RunStore, strategy_id: int, pattern: str, steady: list, window_s: float) -> Series:
    """A finished strategy's last window_s up to its last step (the sampler outlives it a little): in the
    stored bins where it ran longer than WINDOW_S, else (or in a store written before them) its samples.
    Its figure is the mean over the steady steps."""
    if not steady:
        return Series([], None)
    first, last = steady[0].t_start, steady[-1].t_end
    start = max(first, last - window_s)
    shown = store.binned_sums(strategy_id, pattern, start, last) if last - first >= WINDOW_S else None
    if shown is None:
        shown = [v for t, v in _summed_by_time(store.samples(strategy_id, pattern, after_t=start)) if t <= last]
    return Series(shown, store.mean_between(strategy_id, pattern, first, last))


def _strategy_view(
    store: RunStore,
    strategy_id: int,
    steps: list,
    events_of: Callable[[str], list],
    summary: StrategySummary,
    windows: dict[str, SampleWindow],
    window_s: float,
    with_samples: bool = True,
) -> StrategyView:
    finished = summary.status.finished
    steady = steady_state(steps) if finished else []  # a finished strategy's windows end at its last step
    shown = steps[-WINDOW_STEPS:]

    def sampled(field: str) -> Series:
        if not with_samples:
            return Series([], None)
        if finished:
            return _finished_series(store, strategy_id, SAMPLED[field], steady, window_s)
        return Series.of(windows[field].update(store, strategy_id), False, None)

    # Only the shown steps are walked: the figures over every steady step are the summary's (a poll of a
    # day-long run walked all of its steps again here).
    allocated = [float(r.peak_allocated_bytes) for r in shown if r.peak_allocated_bytes is not None]
    return StrategyView(
        summary=summary,
        step_time_s=Series.of([r.step_time_s for r in shown], finished, summary.mean_step_time_s),
        tokens_per_s=Series.of([r.tokens_per_s for r in shown], finished, summary.tokens_per_s),
        gpu_allocated_bytes=Series.of(allocated, finished, summary.peak_allocated_bytes),
        **{field: sampled(field) for field in SAMPLED},
        telemetry_notes=[e["detail"] for e in events_of(TELEMETRY_NOTE)],
        eta_s=_eta(summary),
        stage=_stage_after_steps(events_of, summary),
        window_s=window_s,
        stepped_s=steps[-1].t_end - steps[0].t_start if steps else 0.0,
    )


def _drawn_steps(store: RunStore, strategy_id: int) -> list:
    """What a finished strategy's panel draws of its rank-0 steps: the first two (its steady steps start at
    the second) and the last WINDOW_STEPS, not the 17k of a day on 4 strategies at a step every 20 s."""
    head = store.steps(strategy_id, rank=0, first=2)
    tail = store.steps(strategy_id, rank=0, after_step=head[-1].step if head else 0, last=WINDOW_STEPS)
    return head + tail


def _stage_after_steps(events_of: Callable[[str], list], summary: StrategySummary) -> str | None:
    """A strategy still running after its last step restarted its ranks to verify its checkpoint (minutes
    at a billion parameters): its last launch says so. Looked at only then, not at every poll of its steps."""
    if summary.status is not Status.RUNNING or summary.steps_done < summary.steps_planned:
        return None
    launches = events_of(RANK_PROCESS_EVENT)
    if launches and json.loads(launches[-1]["detail"]).get("mode") == "verify":
        return "verifying checkpoint"
    return None


class RunReader:
    """One run as the dashboard polls it: the summaries follow the store through a cache (a poll reads
    what was written since the last), and a finished strategy's panel data is read once per window."""

    def __init__(
        self,
        run_dir: Path,
        window_s: float = WINDOW_S,
        stop: threading.Event | None = None,
        figures_first: bool = False,
    ):
        """figures_first: the first read leaves the sampled series to the next (the dashboard's first frame
        waits for the figures only: a running strategy's first window on 8 GPUs is 100k samples)."""
        self.run_dir, self.stop = Path(run_dir), stop
        self._kept = KeptStore(self.run_dir)
        self._cache = SummaryCache(recompute_share=RECOMPUTE_SHARE)
        self._finished: dict[str, StrategyView] = {}
        self._windows: dict[str, dict[str, SampleWindow]] = {}
        self._samples_deferred = figures_first
        self.window_s = window_s

    @property
    def window_s(self) -> float:
        return self._window_s

    @window_s.setter
    def window_s(self, seconds: float) -> None:
        """Another window: the sampled series are read afresh over it."""
        self._window_s = seconds
        self._finished, self._windows = {}, {}

    def read(self) -> RunView:
        return read_store(self.run_dir, self._read, self.stop, self._kept)

    def close(self) -> None:
        self._kept.close()

    def _read(self, store: RunStore) -> RunView:
        run = store.run()
        ids = {row["name"]: row["id"] for row in store.strategies(run["id"])}
        first, self._samples_deferred = self._samples_deferred, False
        views = []
        for summary in summarize(store, self._cache):
            kept = self._finished.get(summary.name)
            if kept is not None:
                # Its own figures are final; practicality and the loss check can still change with others.
                views.append(dataclasses.replace(kept, summary=summary))
                continue
            windows = self._windows.setdefault(
                summary.name, {f: SampleWindow(p, self.window_s) for f, p in SAMPLED.items()}
            )
            strategy_id = ids[summary.name]
            followed = self._cache.strategies.get(strategy_id)
            steps = followed.rank0 if followed else _drawn_steps(store, strategy_id)

            def events_of(kind: str, followed=followed, strategy_id=strategy_id) -> list:
                # Rank 0's as the cache followed them: a query over every event of a day-long strategy
                # cost 2 ms a poll. One summarized from its stored figures was not followed, and has ended:
                # the sampler's notes are all its panel shows (read once, its view is kept).
                return followed.events.get(kind, []) if followed else store.events_of_rank(strategy_id, kind, None)

            view = _strategy_view(
                store, strategy_id, steps, events_of, summary, windows, self.window_s, with_samples=not first
            )
            if summary.status.finished and not first:
                self._finished[summary.name] = view
            views.append(view)
        return RunView(
            self.run_dir,
            run["name"],
            store.run_status(),
            run["created_at"],
            views,
            store.last_written(),
            samples_pending=first and bool(views),
        )


class FirstRead:
    """A run's first read, begun in a thread of its own as the app is made: it runs beside Textual's start
    and the dashboard's composing, which the first frame otherwise waited for before the read began."""

    def __init__(self, run_dir: Path, window_s: float = WINDOW_S):
        self.reader = RunReader(run_dir, window_s, threading.Event(), figures_first=True)
        self._result: RunView | ReaderError | None = None
        self._ending, self._ended = threading.Lock(), False
        self._thread = threading.Thread(target=self._read, name="offloadlab-first-read", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            self._result = self.reader.read()
        except ReaderError as err:
            self._result = err
        finally:
            with self._ending:
                self._ended = True
                if self.reader.stop.is_set():  # stopped while it read: no screen will take its store
                    self.reader.close()

    def result(self) -> RunView:
        """Waits for the read; raises its ReaderError."""
        self._thread.join()
        if isinstance(self._result, ReaderError):
            raise self._result
        return self._result

    def stop(self) -> None:
        """Ends the read within a thousand SQLite steps and closes its store (the app quit, or showed
        another run, before a screen took it): here if the read has ended, else as it ends."""
        with self._ending:  # the read's end and the stop, one at a time: one of them closes the store
            self.reader.stop.set()
            if self._ended:
                self.reader.close()


def read_run(run_dir: Path) -> RunView:
    reader = RunReader(run_dir)
    try:
        return reader.read()
    finally:
        reader.close()


def read_tune(run_dir: Path) -> TuneView:
    def read(store: RunStore) -> TuneView:
        run = store.run()
        return TuneView(Path(run_dir), store.run_status(), run["created_at"], store.tune_points(run["id"]))

    return read_store(run_dir, read)


def _entry(run_dir: Path) -> RunEntry | None:
    def read(store: RunStore) -> RunEntry:
        run = store.run()
        strategies = store.strategies(run["id"])
        finished = sum(ran_to_its_end(Status(s["status"]), s["reason"]) for s in strategies)
        kind = "tune" if run["name"] == TUNE_RUN_NAME else "run"
        return RunEntry(run_dir, run["name"], kind, store.run_status(), run["created_at"], finished, len(strategies))

    try:
        return read_store(run_dir, read)
    except ReaderError as err:
        try:
            return RunEntry(run_dir, run_dir.name, "?", f"unreadable: {err}", run_dir.stat().st_mtime, 0, 0)
        except FileNotFoundError:
            return None  # removed while being listed (a stopped tune deletes its folder): not a run any more


def find_runs(root: Path) -> list[RunEntry]:
    """Run directories directly under `root` (and `root` itself if it is one), newest first."""
    root = Path(root)
    candidates = ([root] if (root / DB_NAME).is_file() else []) + runs_in(root)
    entries = [e for e in map(_entry, candidates) if e is not None]
    return sorted(entries, key=lambda e: e.created_at, reverse=True)


def latest(root: Path, kind: str) -> Path | None:
    """The run (or tune) to follow: the newest of those running, else the newest."""
    entries = [e for e in find_runs(root) if e.kind == kind]
    running = [e for e in entries if e.status is Status.RUNNING]
    return next((e.path for e in running + entries), None)


def when(created_at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(created_at))
