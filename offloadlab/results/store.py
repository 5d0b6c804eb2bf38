"""The run store: one SQLite database per run directory, in WAL mode so readers follow a live run.

Writers are the `run` parent (runs, strategies) and each strategy's ranks (steps, events, samples); every
connection waits on locks instead of failing, so ranks can write side by side. Everything else (compare,
report, the TUI, the planner's tune lookup) opens a store read-only: it never writes, never creates a file
beside it, and a file that is not a run store is a one-line `StoreError`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import sqlite3
import stat
import time
from dataclasses import asdict, astuple, dataclass, fields
from pathlib import Path
from urllib.parse import quote

from offloadlab.results.rundir import DB_NAME, RunDir
from offloadlab.results.status import DIED_REASON, Status
from offloadlab.spec import AioSettings

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    spec_toml TEXT NOT NULL,
    created_at REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'running'
);
CREATE TABLE IF NOT EXISTS strategies (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    name TEXT NOT NULL,
    engine TEXT NOT NULL,
    config_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',      -- pending, running, done, failed, does_not_fit
    reason TEXT,
    steps_planned INTEGER NOT NULL,
    started_at REAL,
    finished_at REAL,
    checkpoint_verified INTEGER,                  -- NULL: not checked, 0/1: result
    checkpoint_detail TEXT,
    UNIQUE (run_id, name)
);
CREATE TABLE IF NOT EXISTS steps (
    strategy_id INTEGER NOT NULL REFERENCES strategies(id),
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    phase TEXT NOT NULL DEFAULT 'train',          -- train, or restored for the step run after a restore
    loss REAL NOT NULL,
    t_start REAL NOT NULL,
    t_end REAL NOT NULL,
    tokens_per_s REAL NOT NULL,
    peak_allocated_bytes INTEGER,
    peak_reserved_bytes INTEGER,
    peak_active_bytes INTEGER,
    host_rss_peak_bytes INTEGER NOT NULL,
    disk_read_bytes INTEGER NOT NULL,             -- this rank's block-layer I/O during the step (/proc/pid/io)
    disk_write_bytes INTEGER NOT NULL,
    PRIMARY KEY (strategy_id, rank, step, phase)
);
-- The rows are in the order written, a step's ranks side by side, so reading one rank's steps through the
-- key touches every rank's pages: a covering index keeps each rank's together (rank 0's 4k steps of a day
-- on 8 ranks read in half the time). And the newest steps over every rank, summed as a live run polls.
CREATE INDEX IF NOT EXISTS steps_of_rank ON steps (strategy_id, rank, phase, step, loss, t_start, t_end,
    tokens_per_s, peak_allocated_bytes, peak_reserved_bytes, peak_active_bytes, host_rss_peak_bytes,
    disk_read_bytes, disk_write_bytes);
CREATE INDEX IF NOT EXISTS steps_by_step ON steps (strategy_id, phase, step);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    strategy_id INTEGER REFERENCES strategies(id),
    rank INTEGER,
    step INTEGER,
    kind TEXT NOT NULL,
    t_start REAL NOT NULL,
    t_end REAL,
    detail TEXT
);
-- A strategy's events by rank: each rank writes a few a step, and readers want rank 0's.
CREATE INDEX IF NOT EXISTS events_by_strategy ON events (strategy_id, rank, id);
-- Where a rank's events of the steps past some step begin: a seek, not a walk over the steps before it.
CREATE INDEX IF NOT EXISTS events_by_step ON events (strategy_id, rank, step);
-- Keyed by series and time, without a rowid: the table is its own index, half the bytes of a table plus a
-- covering index (stores written before keep that pair, and read the same way).
CREATE TABLE IF NOT EXISTS samples (
    strategy_id INTEGER NOT NULL REFERENCES strategies(id),
    t REAL NOT NULL,
    source TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (strategy_id, metric, t)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tune_points (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL,                          -- coarse, refine N
    block_size INTEGER NOT NULL,
    queue_depth INTEGER NOT NULL,
    intra_op_parallelism INTEGER NOT NULL,
    single_submit INTEGER NOT NULL,
    overlap_events INTEGER NOT NULL,
    read_gbps REAL NOT NULL,
    read_spread REAL NOT NULL,                    -- (max - min) / mean over repeats
    write_gbps REAL NOT NULL,
    write_spread REAL NOT NULL,
    repeats INTEGER NOT NULL,
    score_gbps REAL NOT NULL,
    is_best INTEGER NOT NULL,
    is_deepspeed_default INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS created_paths (      -- folders a run made outside its run folder (NVMe swap)
    run_id INTEGER NOT NULL REFERENCES runs(id),
    path TEXT NOT NULL,
    secret TEXT NOT NULL,                        -- what the folder's owner marker must hold (rundir.py)
    PRIMARY KEY (run_id, path)
);
CREATE TABLE IF NOT EXISTS checkpoint_files (   -- every file a save wrote, checked before a restore reads any
    strategy_id INTEGER NOT NULL REFERENCES strategies(id),
    folder TEXT NOT NULL,                        -- the step folder's name
    path TEXT NOT NULL,                          -- relative to it
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    PRIMARY KEY (strategy_id, folder, path)
);
CREATE TABLE IF NOT EXISTS step_telemetry (     -- a step's figures from the samples, written once they are all in
    strategy_id INTEGER NOT NULL REFERENCES strategies(id),
    step INTEGER NOT NULL,                        -- rank 0's training step
    gpu_idle_share REAL,
    device_read_bytes REAL,
    device_write_bytes REAL,
    pcie_tx_bytes_per_s REAL,
    pcie_rx_bytes_per_s REAL,
    PRIMARY KEY (strategy_id, step)
);
CREATE TABLE IF NOT EXISTS step_totals (        -- a step's figures over its ranks' rows and rank 0's timings,
    strategy_id INTEGER NOT NULL REFERENCES strategies(id),  -- written once every rank has written the step
    step INTEGER NOT NULL,
    disk_read_bytes INTEGER NOT NULL,             -- summed over the ranks
    disk_write_bytes INTEGER NOT NULL,
    peak_allocated_bytes INTEGER,                 -- the highest rank's
    peak_reserved_bytes INTEGER,
    host_rss_peak_bytes INTEGER,
    forward_s REAL,                               -- rank 0's seconds in each phase; NULL where not timed
    backward_s REAL,
    optimizer_s REAL,
    comm_bytes REAL,                              -- rank 0's collectives, all kinds; NULL where none
    comm_s REAL,
    swap_wait_forward_s REAL,                     -- rank 0's waits for its NVMe swaps; NULL where none
    swap_wait_backward_s REAL,
    swap_wait_optimizer_s REAL,
    swap_wait_other_s REAL,
    PRIMARY KEY (strategy_id, step)
);
CREATE TABLE IF NOT EXISTS strategy_figures (   -- a strategy's own figures, written once it has ended
    strategy_id INTEGER PRIMARY KEY REFERENCES strategies(id),
    written_for TEXT NOT NULL,                    -- its strategies row then, as JSON: not its figures if it changed
    figures TEXT NOT NULL                         -- summary.StrategySummary's fields, as JSON
);
CREATE TABLE IF NOT EXISTS sample_bins (        -- each metric's samples per bin of time, kept as they are written
    strategy_id INTEGER NOT NULL REFERENCES strategies(id),
    metric TEXT NOT NULL,
    width_s REAL NOT NULL,                       -- one of BIN_WIDTHS_S
    bin INTEGER NOT NULL,                        -- floor(t / width_s)
    n INTEGER NOT NULL,                          -- samples with a value in the bin
    total REAL NOT NULL,
    lo REAL NOT NULL,
    hi REAL NOT NULL,
    PRIMARY KEY (strategy_id, metric, width_s, bin)
);
"""


BIN_WIDTHS_S = (10.0, 300.0)
"""Widths of the bins every sample is added to as it is written: a chart or a mean over hours reads a few
thousand bins, not millions of samples (a day at 10 Hz is 864k samples a metric, 8,640 10-s bins)."""


CHART_BINS_AT_LEAST = 200
"""binned_samples draws from wider stored bins (fewer rows) only while they still make this many points."""


# SQLite's header field for "which program's file is this" ("OFLB"). Set before the store turns to WAL, so
# it is in the main file from the start and a reader of the first 100 bytes sees it, whatever the WAL holds.
APPLICATION_ID = 0x4F464C42
SQLITE_MAGIC = b"SQLite format 3\x00"


class StoreError(Exception):
    """A run store that cannot be read; the message is one line that names the file."""


def application_id(path: Path) -> int | None:
    """The SQLite header's application id, read as plain bytes (no SQLite connection, so nothing is
    written); None for a file that is no SQLite database (empty, another format, unreadable)."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError:
        return None
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return None
    return int.from_bytes(header[68:72], "big")


def is_run_store(path: Path) -> bool:
    """Marked as offloadlab's in its header: what a sweep of other runs' folders asks before it reads one."""
    return application_id(path) == APPLICATION_ID


def connect(run_dir: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(Path(run_dir) / DB_NAME, timeout=30.0, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=30000")
    conn.row_factory = sqlite3.Row
    return conn


def create(run_dir: Path) -> sqlite3.Connection:
    with contextlib.closing(sqlite3.connect(Path(run_dir) / DB_NAME, isolation_level=None)) as conn:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn = connect(run_dir)
    conn.executescript(SCHEMA)
    return conn


def read_only_mode(path: Path) -> str:
    """How a reader opens the store so that it never changes a byte of it or adds a file beside it.

    Without a -wal file no process has it open and all of it is in the main file: immutable (which also
    works on a read-only mount). With one, its WAL is read; a plain read-only reader rewrites the -shm
    index, which for a live run's store is the writers' shared state anyway, but for a dead run's, or a copy
    of a live one, would change a file offloadlab does not own: there the index is only read."""
    if not path.with_name(f"{DB_NAME}-wal").exists():
        return "&immutable=1"
    return "" if RunDir(path.parent).is_live() else "&readonly_shm=1"


def runs_in(folder: Path) -> list[Path]:
    """The run folders directly inside folder, newest store first."""
    if not folder.is_dir():
        return []
    stamped = []
    for child in folder.iterdir():
        # A stopped tune deletes its folder: one removed while listed is not a run any more.
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            found = (child / DB_NAME).stat()
            if stat.S_ISREG(found.st_mode):
                stamped.append((found.st_mtime, child))
    return [child for _, child in sorted(stamped, reverse=True)]


PASS_A_RUN = "pass a run's folder (`offloadlab run` prints it)"


def connect_read_only(run_dir: Path) -> sqlite3.Connection:
    path = Path(run_dir) / DB_NAME
    if not path.is_file():
        runs = runs_in(Path(run_dir))
        if runs:
            shown = ", ".join(r.name for r in runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
            raise StoreError(f"{run_dir} is a folder of {len(runs)} runs ({shown}): pass one, e.g. {runs[0]}")
        if not Path(run_dir).exists():
            raise StoreError(f"{run_dir} does not exist: {PASS_A_RUN}")
        if Path(run_dir).is_file():  # the store itself, often: its folder is the run
            fix = f"pass the run's folder, {Path(run_dir).parent}" if Path(run_dir).name == DB_NAME else PASS_A_RUN
            raise StoreError(f"{run_dir} is a file: {fix}")
        raise StoreError(f"{run_dir} holds no {DB_NAME}: not an offloadlab run directory ({PASS_A_RUN})")
    if path.stat().st_size == 0:
        raise StoreError(f"{path} is empty: not an offloadlab run store ({PASS_A_RUN})")
    if application_id(path) not in (None, 0, APPLICATION_ID):
        raise StoreError(f"{path} is another program's database, not an offloadlab run store ({PASS_A_RUN})")
    try:
        # Any thread may read through it, one at a time: the TUI keeps a store open between polls, and each
        # poll reads in a worker thread of its own.
        conn = sqlite3.connect(
            f"file:{quote(str(path))}?mode=ro{read_only_mode(path)}",
            uri=True,
            timeout=30.0,
            isolation_level=None,
            check_same_thread=False,
        )
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as err:
        raise StoreError(
            f"{path} is not a readable SQLite database ({err}): corrupt, truncated or not a run store. A copy: "
            f"copy it again with the {DB_NAME}-wal beside it; else run the spec again"
        ) from None
    if not {"runs", "strategies"} <= tables:
        conn.close()
        raise StoreError(f"{path} is another program's database, not an offloadlab run store ({PASS_A_RUN})")
    conn.execute("PRAGMA busy_timeout=30000")
    conn.row_factory = sqlite3.Row
    return conn


# Not frozen: a frozen dataclass's init sets each field through object.__setattr__, 6 of the ms a reader
# takes to build a day's 4k steps of one rank (a plain slotted one, 1).
@dataclass(slots=True)
class StepRecord:
    step: int
    loss: float
    t_start: float
    t_end: float
    tokens_per_s: float
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    peak_active_bytes: int | None
    host_rss_peak_bytes: int
    disk_read_bytes: int
    disk_write_bytes: int
    phase: str = "train"

    @property
    def step_time_s(self) -> float:
        return self.t_end - self.t_start


STEP_COLUMNS = ", ".join(f.name for f in fields(StepRecord))


@dataclass(slots=True)  # not frozen: as StepRecord
class StepTelemetry:
    """A step's figures from the sampler's series over the step's time."""

    gpu_idle_share: float | None
    """1 - mean GPU utilization over the step's samples (all GPUs)."""
    device_read_bytes: float | None
    """Bytes the nvme_path's block device read during the step (whole device, all processes)."""
    device_write_bytes: float | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None


@dataclass(frozen=True)
class TunePoint:
    """One aio setting `tune` measured, with its figures (GB/s; spread: (max - min) / mean over repeats)."""

    aio: AioSettings
    stage: str
    """coarse, refine N, or repeat."""
    read_gbps: float
    read_spread: float
    write_gbps: float
    write_spread: float
    repeats: int
    score_gbps: float
    is_best: bool = False
    is_deepspeed_default: bool = False

    def as_dict(self) -> dict:
        """Flat: the store's columns, and `tune --json`'s points."""
        figures = {k: v for k, v in asdict(self).items() if k != "aio"}
        return {"stage": self.stage, **self.aio.model_dump(), **figures}

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "TunePoint":
        aio = AioSettings(**{k: row[k] for k in AioSettings.model_fields})
        return cls(
            aio,
            row["stage"],
            row["read_gbps"],
            row["read_spread"],
            row["write_gbps"],
            row["write_spread"],
            row["repeats"],
            row["score_gbps"],
            bool(row["is_best"]),
            bool(row["is_deepspeed_default"]),
        )


class RunStore:
    """Typed writes and reads over one run directory's database: read-only unless `writable` (the run's
    own processes) or `create_schema` (the process that starts the run or tune)."""

    def __init__(self, run_dir: Path, create_schema: bool = False, writable: bool = False):
        self.run_dir = Path(run_dir)
        self._metric_names: dict[int, list[str]] = {}
        if create_schema:
            self.conn = create(self.run_dir)
        elif writable:
            connect_read_only(self.run_dir).close()  # identified read-only first: a foreign file stays as it is
            self.conn = connect(self.run_dir)
            self.conn.executescript(SCHEMA)  # a store written before a table was added gets it
        else:
            self.conn = connect_read_only(self.run_dir)

    def close(self) -> None:
        self.conn.close()

    # -- writes ---------------------------------------------------------------------------------------
    def add_run(self, name: str, spec_toml: str) -> int:
        cur = self.conn.execute(
            "INSERT INTO runs (name, spec_toml, created_at) VALUES (?, ?, ?)", (name, spec_toml, time.time())
        )
        return cur.lastrowid

    def add_strategy(self, run_id: int, name: str, engine: str, config: dict, steps_planned: int) -> int:
        cur = self.conn.execute(
            "INSERT INTO strategies (run_id, name, engine, config_json, steps_planned) VALUES (?, ?, ?, ?, ?)",
            (run_id, name, engine, json.dumps(config), steps_planned),
        )
        return cur.lastrowid

    def set_run_status(self, run_id: int, status: Status) -> None:
        self.conn.execute("UPDATE runs SET status = ? WHERE id = ?", (status, run_id))

    def set_strategy_status(self, strategy_id: int, status: Status, reason: str | None = None) -> None:
        now = time.time()
        if status is Status.RUNNING:
            self.conn.execute(
                "UPDATE strategies SET status = ?, started_at = ? WHERE id = ?", (status, now, strategy_id)
            )
        else:
            self.conn.execute(
                "UPDATE strategies SET status = ?, reason = ?, finished_at = ? WHERE id = ?",
                (status, reason, now, strategy_id),
            )

    def set_checkpoint_result(self, strategy_id: int, verified: bool, detail: str) -> None:
        self.conn.execute(
            "UPDATE strategies SET checkpoint_verified = ?, checkpoint_detail = ? WHERE id = ?",
            (int(verified), detail, strategy_id),
        )

    def add_step(self, strategy_id: int, rank: int, rec: StepRecord) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                strategy_id,
                rank,
                rec.step,
                rec.phase,
                rec.loss,
                rec.t_start,
                rec.t_end,
                rec.tokens_per_s,
                rec.peak_allocated_bytes,
                rec.peak_reserved_bytes,
                rec.peak_active_bytes,
                rec.host_rss_peak_bytes,
                rec.disk_read_bytes,
                rec.disk_write_bytes,
            ),
        )

    def add_events(
        self, strategy_id: int, rank: int, events: list[tuple[int | None, str, float, float | None, str | None]]
    ) -> None:
        """Many (step, kind, t_start, t_end, detail) rows in one transaction."""
        with self.conn:
            self.conn.executemany(
                "INSERT INTO events (strategy_id, rank, step, kind, t_start, t_end, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(strategy_id, rank, *e) for e in events],
            )

    def add_samples(self, strategy_id: int, rows: list[tuple[float, str, str, float | None]]) -> None:
        """Many (t, source, metric, value) rows in one transaction, added to their bins in the same one."""
        bins: dict[tuple[str, float, int], list[float]] = {}
        for t, _, metric, value in rows:
            if value is not None:
                for width in BIN_WIDTHS_S:
                    bins.setdefault((metric, width, math.floor(t / width)), []).append(value)
        with self.conn:
            self.conn.executemany(
                "INSERT INTO samples (strategy_id, t, source, metric, value) VALUES (?, ?, ?, ?, ?)",
                [(strategy_id, *r) for r in rows],
            )
            self.conn.executemany(
                "INSERT INTO sample_bins VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO UPDATE SET n = n + excluded.n, total = total + excluded.total, "
                "lo = MIN(lo, excluded.lo), hi = MAX(hi, excluded.hi)",
                [(strategy_id, *key, len(v), math.fsum(v), min(v), max(v)) for key, v in bins.items()],
            )

    def add_step_telemetry(self, strategy_id: int, figures: dict[int, StepTelemetry]) -> None:
        """Steps' figures once their samples are all in (the sampler writes them as it goes)."""
        with self.conn:
            self.conn.executemany(
                "INSERT OR REPLACE INTO step_telemetry VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(strategy_id, step, *astuple(f)) for step, f in figures.items()],
            )

    def add_step_totals(self, strategy_id: int, rows: list[tuple]) -> None:
        """Steps' step_totals rows (step first, in the table's order) once every rank has written them."""
        marks = ", ".join("?" * (1 + len(rows[0])))
        with self.conn:
            self.conn.executemany(
                f"INSERT OR REPLACE INTO step_totals VALUES ({marks})", [(strategy_id, *row) for row in rows]
            )

    def put_strategy_figures(self, strategy_id: int, written_for: str, figures: str) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO strategy_figures VALUES (?, ?, ?)", (strategy_id, written_for, figures)
        )

    def upsert_tune_points(self, run_id: int, points: list[TunePoint]) -> None:
        """Write points as `tune` measures them; a point written again (more repeats, final flags) replaces its row."""
        rows = [p.as_dict() for p in points]
        with self.conn:
            self.conn.executemany(
                "DELETE FROM tune_points WHERE run_id = :run_id AND block_size = :block_size "
                "AND queue_depth = :queue_depth "
                "AND intra_op_parallelism = :intra_op_parallelism AND single_submit = :single_submit "
                "AND overlap_events = :overlap_events",
                [{"run_id": run_id, **r} for r in rows],
            )
            self.conn.executemany(
                "INSERT INTO tune_points VALUES (:run_id, :stage, :block_size, :queue_depth, :intra_op_parallelism, "
                ":single_submit, :overlap_events, :read_gbps, :read_spread, :write_gbps, :write_spread, :repeats, "
                ":score_gbps, :is_best, :is_deepspeed_default)",
                [{"run_id": run_id, **r} for r in rows],
            )

    def set_run_spec(self, run_id: int, spec_toml: str) -> None:
        self.conn.execute("UPDATE runs SET spec_toml = ? WHERE id = ?", (spec_toml, run_id))

    def record_created(self, run_id: int, path: Path, secret: str) -> None:
        """Written before the folder is made, so a run that dies at any point leaves a record of it."""
        self.conn.execute("INSERT OR IGNORE INTO created_paths VALUES (?, ?, ?)", (run_id, str(path), secret))

    def record_checkpoint_files(self, strategy_id: int, folder: str, files: dict[str, tuple[int, str]]) -> None:
        with self.conn:
            self.conn.executemany(
                "INSERT OR REPLACE INTO checkpoint_files VALUES (?, ?, ?, ?, ?)",
                [(strategy_id, folder, path, size, sha) for path, (size, sha) in files.items()],
            )

    def forget_created(self, run_id: int, path: Path) -> None:
        self.conn.execute("DELETE FROM created_paths WHERE run_id = ? AND path = ?", (run_id, str(path)))

    def mark_interrupted(self, run_id: int) -> None:
        """A run whose process died: the run and its unfinished strategies say so."""
        with self.conn:
            self.conn.execute("UPDATE runs SET status = ? WHERE id = ?", (Status.INTERRUPTED, run_id))
            self.conn.execute(
                "UPDATE strategies SET status = ?, reason = ?, finished_at = ? WHERE run_id = ? AND status IN (?, ?)",
                (
                    Status.FAILED,
                    f"{Status.INTERRUPTED}: {DIED_REASON}",
                    time.time(),
                    run_id,
                    Status.PENDING,
                    Status.RUNNING,
                ),
            )

    # -- reads ----------------------------------------------------------------------------------------
    def run(self) -> sqlite3.Row:
        row = self.conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            raise LookupError(f"{self.run_dir}: the run store holds no run yet")
        return row

    def run_status(self) -> Status:
        """The run's status, interrupted for one that says running but whose process is gone."""
        status = Status(self.run()["status"])
        if status is Status.RUNNING and not RunDir.at(self.run_dir).is_live():
            return Status.INTERRUPTED
        return status

    def last_written(self) -> float:
        """When the run last recorded anything: a strategy starting or ending, a step (its end). Samples are
        left out: a sampler outliving its strategy is not progress, and their table is the largest. Of the
        steps, the last rows written (each rank's latest among them): a MAX over all of them was a scan of
        the table at every poll of the TUI."""
        row = self.conn.execute(
            "SELECT MAX(t) FROM (SELECT created_at AS t FROM runs UNION ALL SELECT started_at FROM strategies "
            "UNION ALL SELECT finished_at FROM strategies "
            "UNION ALL SELECT t_end FROM (SELECT t_end FROM steps ORDER BY rowid DESC LIMIT 64))"
        ).fetchone()
        return row[0] or 0.0

    def created(self, run_id: int) -> list[tuple[Path, str]]:
        """(folder, the secret its owner marker holds) for each folder the run made outside its folder."""
        rows = self.conn.execute("SELECT path, secret FROM created_paths WHERE run_id = ?", (run_id,))
        return [(Path(path), secret) for path, secret in rows]

    def checkpoint_files(self, strategy_id: int, folder: str) -> dict[str, tuple[int, str]]:
        rows = self.conn.execute(
            "SELECT path, size, sha256 FROM checkpoint_files WHERE strategy_id = ? AND folder = ?",
            (strategy_id, folder),
        )
        return {path: (size, sha) for path, size, sha in rows}

    def strategies(self, run_id: int) -> list[sqlite3.Row]:
        return self.conn.execute("SELECT * FROM strategies WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()

    def strategy(self, strategy_id: int) -> sqlite3.Row:
        return self.conn.execute("SELECT * FROM strategies WHERE id = ?", (strategy_id,)).fetchone()

    def strategy_id(self, run_id: int, name: str) -> int:
        row = self.conn.execute("SELECT id FROM strategies WHERE run_id = ? AND name = ?", (run_id, name)).fetchone()
        if row is None:
            raise LookupError(f"run {run_id} has no strategy {name!r}")
        return row["id"]

    def steps(
        self,
        strategy_id: int,
        rank: int | None = 0,
        phase: str = "train",
        after_step: int = 0,
        first: int | None = None,
        last: int | None = None,
    ) -> list[StepRecord]:
        """The strategy's steps in order; `after_step`: only those past it (a poll reads what is new);
        `first`, `last`: only the first or last that many rows (an index walk from that end)."""
        query = f"SELECT {STEP_COLUMNS} FROM steps WHERE strategy_id = ? AND phase = ? AND step > ?"
        args: tuple = (strategy_id, phase, after_step)
        if rank is not None:
            query += " AND rank = ?"
            args += (rank,)
        order = " ORDER BY step DESC, rank DESC" if last is not None else " ORDER BY step, rank"
        limit = last if last is not None else first
        cursor = self.conn.cursor()
        cursor.row_factory = None  # plain tuples, in StepRecord's order: a day of steps on 8 ranks is 35k rows
        rows = cursor.execute(query + order + " LIMIT ?", (*args, -1 if limit is None else limit))
        records = [StepRecord(*row) for row in rows]
        return records[::-1] if last is not None else records

    def steps_over_ranks(self, strategy_id: int, after_step: int = 0) -> list[tuple]:
        """(step, ranks that wrote it, disk bytes read, written, and the highest rank's peak allocated,
        reserved and host RSS) of each training step past after_step, summed over the ranks in SQL."""
        return self.conn.execute(
            "SELECT step, COUNT(*), SUM(disk_read_bytes), SUM(disk_write_bytes), MAX(peak_allocated_bytes), "
            "MAX(peak_reserved_bytes), MAX(host_rss_peak_bytes) FROM steps "
            "WHERE strategy_id = ? AND phase = 'train' AND step > ? GROUP BY step ORDER BY step",
            (strategy_id, after_step),
        ).fetchall()

    def last_event_id(self) -> int:
        return self.conn.execute("SELECT MAX(id) FROM events").fetchone()[0] or 0

    def seconds_by_step(
        self, strategy_id: int, rank: int, kinds: tuple[str, ...], after_id: int, up_to_id: int
    ) -> list[tuple[int, str, float]]:
        """(step, kind, seconds) of a rank's timed events of those kinds recorded in (after_id, up_to_id],
        summed in SQL per step and kind (a phase repeats once per micro-batch)."""
        return self.conn.execute(
            f"SELECT step, kind, SUM(t_end - t_start) FROM events WHERE strategy_id = ? AND rank = ? "
            f"AND kind IN ({', '.join('?' * len(kinds))}) AND id > ? AND id <= ? AND t_end IS NOT NULL "
            "GROUP BY step, kind",
            (strategy_id, rank, *kinds, after_id, up_to_id),
        ).fetchall()

    def steps_trained(self, strategy_id: int) -> int:
        """The last training step rank 0 recorded (0 before the first)."""
        row = self.conn.execute(
            "SELECT MAX(step) FROM steps WHERE strategy_id = ? AND rank = 0 AND phase = 'train'", (strategy_id,)
        ).fetchone()
        return row[0] or 0

    def newest_sample_t(self, strategy_id: int) -> float:
        """The time of the strategy's last sample (an index seek), -inf before the first."""
        row = self.conn.execute(
            "SELECT MAX(t) FROM samples WHERE strategy_id = ? AND metric = ?",
            (strategy_id, (self.metrics(strategy_id) or [""])[0]),
        ).fetchone()
        return row[0] if row[0] is not None else -math.inf

    def last_sample_t_before(self, strategy_id: int, metric_like: str, t: float) -> float:
        """The earliest over matching metrics of each one's last sample time before t (an index seek
        each); -inf where one has none."""
        query = "SELECT MAX(t) FROM samples WHERE strategy_id = ? AND metric = ? AND t < ?"
        found = [
            self.conn.execute(query, (strategy_id, name, t)).fetchone()[0]
            for name in self._metrics_like(strategy_id, metric_like)
        ]
        return min((-math.inf if f is None else f for f in found), default=-math.inf)

    def metrics(self, strategy_id: int) -> list[str]:
        """The metric names a strategy's samples hold: one index seek per name (a long run has millions of
        samples and a dozen names; DISTINCT would read them all)."""
        if strategy_id in self._metric_names:
            return self._metric_names[strategy_id]
        names: list[str] = []
        query = "SELECT MIN(metric) FROM samples WHERE strategy_id = ? AND metric > ?"
        while (name := self.conn.execute(query, (strategy_id, names[-1] if names else "")).fetchone()[0]) is not None:
            names.append(name)
        if names:  # the sampler writes every one of its names in each flush: once there are some, that is all
            self._metric_names[strategy_id] = names
        return names

    def _metrics_like(self, strategy_id: int, metric_like: str) -> list[str]:
        """The strategy's metric names a LIKE pattern matches (as SQLite's LIKE: % any run, _ one character,
        case-insensitive), matched here so queries can use the (strategy, metric, t) index by name."""
        pattern = re.compile(re.escape(metric_like).replace("%", ".*").replace("_", "."), re.IGNORECASE)
        return [m for m in self.metrics(strategy_id) if pattern.fullmatch(m)]

    def samples(
        self, strategy_id: int, metric_like: str, after_t: float | None = None
    ) -> list[tuple[float, str, float | None]]:
        """(t, metric, value) of a strategy's samples whose metric matches a LIKE pattern (and later than
        after_t), by time, read only from the matching metrics' rows, not every sample."""
        names = self._metrics_like(strategy_id, metric_like)
        if not names:
            return []
        cursor = self.conn.cursor()
        cursor.row_factory = None  # plain tuples: a long run reads 100k rows a metric, sqlite3.Row costs 2x
        return cursor.execute(
            f"SELECT t, metric, value FROM samples WHERE strategy_id = ? AND metric IN ({', '.join('?' * len(names))})"
            " AND t > ? ORDER BY t",
            (strategy_id, *names, -math.inf if after_t is None else after_t),
        ).fetchall()

    def binned_samples(
        self, strategy_id: int, metric_like: str, max_bins: int, min_periods: int
    ) -> dict[str, list[tuple[float, float | None]]]:
        """Per matching metric, the mean of its samples in each of at most `max_bins` equal time bins (bin
        centre, mean), each at least `min_periods` sampling periods wide; None for an empty bin (a gap).
        Averaged in SQL from the stored bins where they are fine enough (hours of samples are never read),
        else from the samples."""
        out = {}
        binned = self._has_bins(strategy_id)
        for name in self._metrics_like(strategy_id, metric_like):
            stored = binned and self._bins_span(strategy_id, name)
            start, end, count = (
                stored
                or self.conn.execute(
                    "SELECT MIN(t), MAX(t), COUNT(*) FROM samples WHERE strategy_id = ? AND metric = ?",
                    (strategy_id, name),
                ).fetchone()
            )
            if count < 2:
                continue
            period = (end - start) / (count - 1)
            bins = int(max(1, min(max_bins, (end - start) / (min_periods * period or 1.0))))
            # The widest stored bins that still make a line of CHART_BINS_AT_LEAST points: a day of 10-s
            # bins is 8,640 rows a metric, of 300-s bins 288 (the chart's bins then as wide as those).
            wide = [w for w in BIN_WIDTHS_S if (end - start) / w >= CHART_BINS_AT_LEAST] if stored else []
            if wide and wide[-1] > (end - start) / bins:
                bins = int((end - start) // wide[-1])
            width = (end - start) / bins or 1.0
            coarse = [w for w in BIN_WIDTHS_S if w <= width]
            if stored and coarse:
                means = self._means_from_bins(strategy_id, name, coarse[-1], start, width, bins)
            else:
                means = dict(
                    self.conn.execute(
                        "SELECT MIN(CAST((t - ?) / ? AS INTEGER), ?), AVG(value) FROM samples "
                        "WHERE strategy_id = ? AND metric = ? AND value IS NOT NULL GROUP BY 1",
                        (start, width, bins - 1, strategy_id, name),
                    )
                )
            out[name] = [(start + (i + 0.5) * width, means.get(i)) for i in range(bins)]
        return out

    def _bins_span(self, strategy_id: int, metric: str) -> tuple[float, float, int] | None:
        """(first sample's t, last sample's t, samples): the count from the stored bins, the times from
        the (strategy, metric, t) index, one seek each (the bins' edges made a short strategy's last
        seconds one point, or none); None if the metric has no bins."""
        count = self.conn.execute(  # every sample is in one bin of each width: the widest are fewest
            "SELECT SUM(n) FROM sample_bins WHERE strategy_id = ? AND metric = ? AND width_s = ?",
            (strategy_id, metric, BIN_WIDTHS_S[-1]),
        ).fetchone()[0]
        if count is None:
            return None
        where = "FROM samples WHERE strategy_id = ? AND metric = ?"
        first = self.conn.execute(f"SELECT MIN(t) {where}", (strategy_id, metric)).fetchone()[0]
        last = self.conn.execute(f"SELECT MAX(t) {where}", (strategy_id, metric)).fetchone()[0]
        return first, last, count

    def _means_from_bins(
        self, strategy_id: int, metric: str, stored_width: float, start: float, width: float, bins: int
    ) -> dict[int, float]:
        rows = self.conn.execute(
            "SELECT MAX(MIN(CAST((bin * ? - ?) / ? AS INTEGER), ?), 0), SUM(total) / SUM(n) FROM sample_bins "
            "WHERE strategy_id = ? AND metric = ? AND width_s = ? GROUP BY 1",
            (stored_width, start, width, bins - 1, strategy_id, metric, stored_width),
        )
        return dict(rows)

    def binned_sums(self, strategy_id: int, metric_like: str, start: float, end: float) -> list[float] | None:
        """Per finest stored bin inside [start, end), by time, the sum over matching metrics (GPUs, devices)
        of each one's mean in it: a sparkline of hours without reading the samples; None where the
        strategy's samples were not binned as written."""
        names = self._metrics_like(strategy_id, metric_like)
        if not self._has_bins(strategy_id) or not names:
            return None
        width = BIN_WIDTHS_S[0]
        rows = self.conn.execute(
            f"SELECT bin, SUM(total / n) FROM sample_bins WHERE strategy_id = ? AND width_s = ? "
            f"AND metric IN ({', '.join('?' * len(names))}) AND bin >= ? AND bin < ? GROUP BY bin ORDER BY bin",
            (strategy_id, width, *names, math.ceil(start / width), math.floor(end / width)),
        )
        return [value for _, value in rows]

    def mean_between(self, strategy_id: int, metric_like: str, start: float, end: float) -> float | None:
        """The sum over matching metrics (GPUs, devices) of each one's mean value sampled in [start, end):
        whole stored bins inside the window, samples only at its two edges."""
        means = []
        widths = BIN_WIDTHS_S[::-1] if self._has_bins(strategy_id) else ()
        for name in self._metrics_like(strategy_id, metric_like):
            count, total = self._window_total(strategy_id, name, start, end, widths)
            if count:
                means.append(total / count)
        return math.fsum(means) if means else None

    def _window_total(
        self, strategy_id: int, metric: str, start: float, end: float, widths: tuple[float, ...]
    ) -> tuple[int, float]:
        """(samples with a value, their sum) in [start, end): the widest bins that fit whole, then finer
        ones at the edges, then the samples."""
        if not widths:
            return self.conn.execute(
                "SELECT COUNT(value), TOTAL(value) FROM samples WHERE strategy_id = ? AND metric = ? "
                "AND t >= ? AND t < ?",
                (strategy_id, metric, start, end),
            ).fetchone()
        width = widths[0]
        first, last = math.ceil(start / width), math.floor(end / width)  # the whole bins: [first, last)
        if first >= last:
            return self._window_total(strategy_id, metric, start, end, widths[1:])
        count, total = self.conn.execute(
            "SELECT COALESCE(SUM(n), 0), TOTAL(total) FROM sample_bins WHERE strategy_id = ? AND metric = ? "
            "AND width_s = ? AND bin >= ? AND bin < ?",
            (strategy_id, metric, width, first, last),
        ).fetchone()
        for edge in ((start, first * width), (last * width, end)):
            more = self._window_total(strategy_id, metric, *edge, widths[1:])
            count, total = count + more[0], total + more[1]
        return count, total

    def _has_bins(self, strategy_id: int) -> bool:
        """Whether the strategy's samples were binned as written (stores before the bins were added: no)."""
        if "sample_bins" not in self._tables:
            return False
        row = self.conn.execute("SELECT 1 FROM sample_bins WHERE strategy_id = ? LIMIT 1", (strategy_id,))
        return row.fetchone() is not None

    @functools.cached_property
    def _tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def step_telemetry(self, strategy_id: int, after_step: int = 0) -> dict[int, StepTelemetry]:
        """Stored figures of the steps past after_step; none in a store written before they were stored."""
        if "step_telemetry" not in self._tables:
            return {}
        cursor = self.conn.cursor()
        cursor.row_factory = None  # plain tuples: sqlite3.Row's took half of a day of steps' read
        query = "SELECT * FROM step_telemetry WHERE strategy_id = ? AND step > ? ORDER BY step"
        return {row[1]: StepTelemetry(*row[2:]) for row in cursor.execute(query, (strategy_id, after_step))}

    def step_totals(self, strategy_id: int, after_step: int = 0) -> list[tuple]:
        """Stored step_totals rows past after_step (step first); none in a store written before them."""
        if "step_totals" not in self._tables:
            return []
        cursor = self.conn.cursor()
        cursor.row_factory = None
        query = "SELECT * FROM step_totals WHERE strategy_id = ? AND step > ? ORDER BY step"
        return [row[1:] for row in cursor.execute(query, (strategy_id, after_step))]

    def first_event_id_after_step(self, strategy_id: int, rank: int, step: int) -> int | None:
        """The id of the rank's first event of a step past `step` (its events are written in step order):
        a seek in events_by_step (in a store written before it, a walk over the rank's events)."""
        return self.conn.execute(
            "SELECT MIN(id) FROM events WHERE strategy_id = ? AND rank = ? AND step > ?", (strategy_id, rank, step)
        ).fetchone()[0]

    def strategy_figures(self, strategy_id: int) -> tuple[str, str] | None:
        """(written_for, figures) as put_strategy_figures stored them; None if not (or a store before them)."""
        if "strategy_figures" not in self._tables:
            return None
        row = self.conn.execute(
            "SELECT written_for, figures FROM strategy_figures WHERE strategy_id = ?", (strategy_id,)
        ).fetchone()
        return None if row is None else tuple(row)

    def tune_points(self, run_id: int) -> list[TunePoint]:
        """Best score first."""
        rows = self.conn.execute("SELECT * FROM tune_points WHERE run_id = ? ORDER BY score_gbps DESC", (run_id,))
        return [TunePoint.from_row(r) for r in rows]

    def events_of_rank(
        self, strategy_id: int, kind: str, rank: int | None, limit: int | None = None
    ) -> list[sqlite3.Row]:
        """One rank's events of a kind (rank None: the sampler's) in the order recorded, the first `limit`
        of them: an index walk over that rank's events that stops there (`events` by kind with rank 0 reads
        the sampler's too, each in a query that sorts them)."""
        rank_is = "rank IS NULL" if rank is None else "rank = ?"
        return self.conn.execute(
            f"SELECT * FROM events WHERE strategy_id = ? AND {rank_is} AND kind = ? ORDER BY id LIMIT ?",
            (strategy_id, *([] if rank is None else [rank]), kind, -1 if limit is None else limit),
        ).fetchall()

    def events(
        self,
        strategy_id: int,
        kind: str | None = None,
        after_id: int = 0,
        rank: int | None = None,
        up_to_id: int | None = None,
        except_kinds: tuple[str, ...] = (),
        stepless: bool = False,
    ) -> list[sqlite3.Row]:
        """By start time; `after_id`, `up_to_id`: only those recorded after that event and up to that one
        (ids grow with each commit); `rank`: only that rank's and those of no rank (the sampler's);
        `stepless`: only those of no step."""
        query, args = "SELECT * FROM events WHERE strategy_id = ? AND id > ?", (strategy_id, after_id)
        if kind is not None:
            query, args = query + " AND kind = ?", (*args, kind)
        if rank is not None:
            query, args = query + " AND (rank = ? OR rank IS NULL)", (*args, rank)
        if up_to_id is not None:
            query, args = query + " AND id <= ?", (*args, up_to_id)
        if except_kinds:
            query, args = query + f" AND kind NOT IN ({', '.join('?' * len(except_kinds))})", (*args, *except_kinds)
        if stepless:
            query += " AND step IS NULL"
        return self.conn.execute(query + " ORDER BY t_start", args).fetchall()
