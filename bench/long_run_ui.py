"""Issues 20 and 38: do compare, report and the TUI stay fast on the stores of hours-long runs?

    python bench/long_run_ui.py [--shapes 6h-2gpu,24h-8gpu] [--folder DIR] [--keep]

Builds each store with the writes a run makes, in its order: the ranks' `add_step` and phase events each
step, the sampler's flush (`add_samples`, then `StepFigures.store_final`, as telemetry.sampler does),
with the sampler's metric names (host, one drive, six per GPU) at 10 Hz, and at a strategy's end its
figures (`store_figures`, as the runner does). The last strategy is left running,
a few steps from its end, with the run folder's lock held. Then, each in its own process as a user meets it:
`compare`, `compare --json`, `report` and the TUI's first frame (process start to the comparison table's
rows drawn, a writer adding a step a second), each REPEATS times with the stores taken in turn (p50 and
max: the first may read a store from the drive, the rest from the page cache, and a 2-core host's speed
drifts over minutes: a ratio is of runs made side by side); how long `q` takes to end the TUI when pressed
during its first read and after, and the CPU share of its poll over 10 s (at its default interval, and
every second) while a writer appends a step, its events and a second of samples every second, from a
second after the first read's sampled series are drawn (read after the first frame: the start's). The
packages' bytecode is compiled first, as pip's install does (a checkout's stale .pyc files cost 0.1-0.2 s
of compiling in each process).
Goals (issue 38): compare, compare --json < 1 s; report < 3 s; first frame < 1 s; q < 0.5 s; poll < 2%
of a core; the 24-hour store's figures within 1.3x of the 6-hour one's.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import importlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from offloadlab.results.figures import MODEL_FACTS_EVENT
from offloadlab.results.rundir import DB_NAME, RunDir
from offloadlab.results.status import Status
from offloadlab.results.steps import SWAP_EVENT, StepFigures
from offloadlab.results.store import RunStore, StepRecord
from offloadlab.results.summary import store_figures
from offloadlab.telemetry.sampler import GPU_FIELDS
from offloadlab_tui.app import POLL_S

FLUSH_S = 60.0
"""Simulated seconds of samples a build writes at once (the sampler flushes every second: what is stored
is the same, the build is faster)."""
GiB = 2**30
SPEC = """name = "{name}"
steps = {steps}
seq_len = 1024
micro_batch = 4
precision = "bf16"
nvme_path = "/mnt/nvme0/offloadlab"
nproc = {ranks}

[model]
preset = "gpt-1.4b"
"""
STRATEGIES = {
    "zero3-nvme": dict(engine="deepspeed", zero_stage=3, offload_optimizer="nvme", offload_param="nvme"),
    "zero2-cpu": dict(engine="deepspeed", zero_stage=2, offload_optimizer="cpu"),
    "fsdp2-cpu-offload": dict(engine="fsdp2", cpu_offload=True),
    "fsdp2": dict(engine="fsdp2"),
}
# Share of a step in each phase.
PHASES = {
    "zero3-nvme": (0.08, 0.08, 0.84),
    "zero2-cpu": (0.15, 0.30, 0.55),
    "fsdp2-cpu-offload": (0.2, 0.4, 0.4),
    "fsdp2": (0.3, 0.6, 0.1),
}


@dataclass(frozen=True)
class Shape:
    strategies: tuple[str, ...]
    hours: float
    """Each strategy's."""
    step_s: float
    gpus: int
    """One rank a GPU, one host."""
    hz: float = 10.0
    """The sampler's rate."""


SHAPES = {
    "6h-2gpu": Shape(tuple(STRATEGIES), 6.0, 20.0, 2),
    "24h-8gpu": Shape(tuple(STRATEGIES), 24.0, 20.0, 8),
    "3h-nvme": Shape(("zero3-nvme",), 3.0, 51.0, 1),
    "8k-fsdp2": Shape(("fsdp2", "zero2-cpu"), 8000 * 0.15 / 3600, 0.15, 1),
    # Ten steps: what a reader costs before any store (the interpreter's, the imports' and Textual's start).
    "10-steps": Shape(("fsdp2",), 10 * 20.0 / 3600, 20.0, 1),
}


def sample_rows(t: float, name: str, shape: Shape) -> list[tuple]:
    wave = 0.5 + 0.5 * math.sin(t / max(shape.step_s, 1.0))
    disk = 1.1e9 * wave if name == "zero3-nvme" else 0.0
    gpu = {"util(%)": 100 * (1 - wave), "mem_used(B)": 18.4 * GiB, "pcie_tx(B/s)": 1e9 * wave,
           "pcie_rx(B/s)": 1e9 * (1 - wave), "power(W)": 300.0, "temp(C)": 50.0}  # fmt: skip
    return [
        (t, "host", "host.cpu(%)", 40 + 30 * wave),
        (t, "host", "host.rss_tree(B)", 41.4 * GiB),
        (t, "host", "host.available(B)", 80 * GiB),
        (t, "host", "host.swap_used(B)", 0.0),
        (t, "disk", "disk.read_bytes(B)", disk / shape.hz),
        (t, "disk", "disk.write_bytes(B)", disk / shape.hz),
        (t, "disk", "disk.read(B/s)", disk),
        (t, "disk", "disk.write(B/s)", disk),
        (t, "disk", "disk.read_iops", disk / 2**20),
        (t, "disk", "disk.write_iops", disk / 2**20),
    ] + [(t, "gpu", f"gpu{i}.{field}", gpu[field]) for i in range(shape.gpus) for field in GPU_FIELDS]


class StrategyWriter:
    """One strategy's processes: its ranks' steps and events, and its sampler's flushes."""

    def __init__(self, store: RunStore, strategy_id: int, name: str, shape: Shape, t: float):
        self.store, self.strategy_id, self.name, self.shape = store, strategy_id, name, shape
        self.t = self.sample_t = t
        self.step = 0
        self.samples: list[tuple] = []
        self.events: dict[int, list[tuple]] = {rank: [] for rank in range(shape.gpus)}
        self.figures = StepFigures(strategy_id)

    def add_step(self) -> None:
        self.step += 1
        length = self.shape.step_s * (8 if self.step == 1 else 1 + 0.05 * math.sin(self.step))
        forward, backward, _ = PHASES[self.name]
        marks = (self.t, self.t + forward * length, self.t + (forward + backward) * length, self.t + length)
        for rank in range(self.shape.gpus):
            self.store.add_step(self.strategy_id, rank, record(self.step, self.t, self.t + length))
            self.events[rank] += [
                (self.step, kind, a, b, None)
                for kind, a, b in zip(("forward", "backward", "optimizer"), marks, marks[1:])
            ]
            if self.name == "zero3-nvme":  # its optimizer's swaps: most of that phase waits for the drive
                wait = 0.6 * length
                swapped = dict(read_bytes=26 * GiB, write_bytes=24 * GiB, wait_seconds=wait)
                swapped.update(wait_by_phase={"optimizer": wait}, phase="train")
                self.events[rank].append((self.step, SWAP_EVENT, self.t, self.t + length, json.dumps(swapped)))
        self.t += length

    def sample_until(self, t: float) -> None:
        while self.sample_t < t:
            self.samples += sample_rows(self.sample_t, self.name, self.shape)
            self.sample_t += 1 / self.shape.hz

    def flush(self, finished: bool = False) -> None:
        for rank, events in self.events.items():
            self.store.add_events(self.strategy_id, rank, events)
            events.clear()
        self.store.add_samples(self.strategy_id, self.samples)
        self.samples = []
        self.figures.store_final(self.store, finished)


def add_strategy(store: RunStore, run_id: int, name: str, shape: Shape, t0: float, running: bool) -> StrategyWriter:
    steps = round(shape.hours * 3600 / shape.step_s)
    strategy_id = store.add_strategy(
        run_id, name, STRATEGIES[name]["engine"], {"name": name, **STRATEGIES[name]}, steps
    )
    store.set_strategy_status(strategy_id, Status.RUNNING)
    facts = dict(n_params=1_420_000_000, n_layers=24, d_model=2048, seq_len=1024, precision="bf16",
                 device_name="NVIDIA H200", world_size=shape.gpus)  # fmt: skip
    store.add_events(strategy_id, 0, [(None, MODEL_FACTS_EVENT, t0, t0, json.dumps(facts))])
    writer = StrategyWriter(store, strategy_id, name, shape, t0)
    next_flush = t0 + FLUSH_S
    for _ in range(steps - 3 if running else steps):  # a running strategy is a few steps from its end
        writer.add_step()
        writer.sample_until(writer.t)
        if writer.t >= next_flush:
            writer.flush()
            next_flush = writer.t + FLUSH_S
    writer.flush(finished=not running)
    if not running:  # as the runner ends a strategy
        store.set_strategy_status(strategy_id, Status.DONE)
        store_figures(store, strategy_id)
    return writer


def record(step: int, start: float, end: float) -> StepRecord:
    return StepRecord(step, 11.0 - step * 1e-3, start, end, 4096 / (end - start), int(9.7 * GiB), int(15.6 * GiB),
                      int(9.7 * GiB), int(41.4 * GiB), 27_900_000_000, 25_500_000_000)  # fmt: skip


def build(folder: Path, name: str, shape: Shape, console: Console) -> Path:
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    store = RunStore(run_dir, create_schema=True)
    store.conn.execute("PRAGMA synchronous=OFF")  # a bench's own scratch store: no fsync per write
    steps = round(shape.hours * 3600 / shape.step_s)
    run_id = store.add_run(name, SPEC.format(name=name, steps=steps, ranks=shape.gpus))
    # The last strategy ends about now, so the live writer carries on from it at the wall clock.
    t = time.time() - shape.hours * 3600 * len(shape.strategies) - 8 * shape.step_s * len(shape.strategies)
    for i, strategy in enumerate(shape.strategies):
        console.log(f"{name}: writing {strategy}")
        t = add_strategy(store, run_id, strategy, shape, t, running=i == len(shape.strategies) - 1).t
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return run_dir


LIVE_WRITER = """
import dataclasses, sys, time
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from long_run_ui import SHAPES, StrategyWriter
from offloadlab.results.store import RunStore

run_dir, shape = Path(sys.argv[1]), dataclasses.replace(SHAPES[sys.argv[3]], step_s=1.0)
store = RunStore(run_dir, writable=True)
row = store.strategies(store.run()["id"])[-1]
steps = store.steps(row["id"], rank=0)
writer = StrategyWriter(store, row["id"], row["name"], shape, steps[-1].t_end)
writer.step, writer.sample_t = steps[-1].step, time.time()
# As the sampler it stands for, it stores every step's figures once final: the steps a killed writer left
# without them too (else a reader measures them from their samples, read from the first such step on).
writer.figures.stored_through = max(store.step_telemetry(row["id"]), default=0)
print("writing", flush=True)
while True:  # until killed: a step, its events and a second of samples, every second
    time.sleep(1.0)
    writer.t = time.time() - 1.0
    writer.add_step()
    writer.sample_until(time.time())
    writer.flush()
"""


REPEATS = 5


def timed(*cmd: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *cmd], check=True, capture_output=True)
    return time.perf_counter() - start


TUI = """
import sys, time
start = time.perf_counter()
import asyncio
from pathlib import Path
from offloadlab_tui.app import make_app
from offloadlab_tui.widgets import CompareTable

def table_rows(app) -> int:
    tables = app.screen.query(CompareTable)  # none while the app has not yet shown the dashboard
    return tables.first().row_count if tables else 0

async def first_frame_and_poll(run_dir, **poll_s):
    app = make_app(root=run_dir.parent, run_dir=run_dir, **poll_s)
    async with app.run_test(size=(120, 40)) as pilot:
        while not table_rows(app):
            await pilot.pause(0.01)
        first = time.perf_counter() - start
        while app.screen.shown is None or app.screen.shown.samples_pending:
            await pilot.pause(0.01)  # the first read's sampled series, read after its frame: the start's, not a poll's
        await pilot.pause(1.0)  # settle: their drawing
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await pilot.pause(10.0)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        quit_at = time.perf_counter()
        await pilot.press("q")
    return first, cpu / wall, time.perf_counter() - quit_at

async def quit_during_first_read(run_dir):
    app = make_app(root=run_dir.parent, run_dir=run_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.05)  # the first read has started in its worker
        quit_at = time.perf_counter()
        await pilot.press("q")
    return time.perf_counter() - quit_at

async def first_frame(run_dir):
    app = make_app(root=run_dir.parent, run_dir=run_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        while not table_rows(app):
            await pilot.pause(0.01)
        first = time.perf_counter() - start
        await pilot.press("q")
    return first

run_dir = Path(sys.argv[1])
if sys.argv[2] == "first":
    print(asyncio.run(first_frame(run_dir)))
else:
    _, share, quit_after = asyncio.run(first_frame_and_poll(run_dir))  # polling at the default interval
    share_1s = asyncio.run(first_frame_and_poll(run_dir, poll_s=1.0))[1]
    print(share, share_1s, quit_after, asyncio.run(quit_during_first_read(run_dir)))
"""


def tui_times(run_dir: Path, what: str) -> list[float]:
    """what: "first" (the first frame's seconds) or "poll" (poll shares at both intervals, q after, q during)."""
    proc = subprocess.run([sys.executable, "-c", TUI, str(run_dir), what], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the TUI's timing exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return [float(x) for x in proc.stdout.split()]


@contextlib.contextmanager
def live_writer(run_dir: Path, shape_name: str):
    """A process appending a step, its events and a second of samples every second to the last strategy."""
    writer = subprocess.Popen(
        [sys.executable, "-c", LIVE_WRITER, str(run_dir), str(Path(__file__).parent), shape_name],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        writer.stdout.readline()
        yield
    finally:
        writer.kill()
        writer.wait()


def time_readers(run_dir: Path, shape_name: str) -> dict[str, float]:
    """One run of each timed reader, as a user meets it."""
    (run_dir / "report.html").unlink(missing_ok=True)
    seconds = dict(
        compare=timed("-m", "offloadlab.cli", "compare", str(run_dir)),
        json=timed("-m", "offloadlab.cli", "compare", str(run_dir), "--json"),
        report=timed("-m", "offloadlab.cli", "report", str(run_dir), "--out", str(run_dir / "report.html")),
    )
    with live_writer(run_dir, shape_name):
        seconds["first"] = tui_times(run_dir, "first")[0]
    return seconds


def measure(folder: Path, names: list[str], console: Console) -> dict[str, dict]:
    """Each reader REPEATS times, the stores taken in turn each time: a host's speed drifts over minutes,
    and the ratio is of runs made side by side. Then each store's TUI poll and q."""
    results = {}
    for name in names:
        store = RunStore(folder / name)
        results[name] = {
            t: store.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("steps", "samples")
        }
        store.close()
        results[name]["db_bytes"] = sum(p.stat().st_size for p in (folder / name).glob(f"{DB_NAME}*"))
    locks = [RunDir.at(folder / name).lock() for name in names]  # live runs: their processes hold the folders
    try:
        for repeat in range(REPEATS):
            for name in names:
                console.log(f"{name}: readers, {repeat + 1} of {REPEATS}")
                for key, seconds in time_readers(folder / name, name).items():
                    results[name].setdefault(key, []).append(seconds)
        for name in names:
            console.log(f"{name}: the TUI's poll")
            with live_writer(folder / name, name):
                poll, poll_1s, quit_after, quit_during = tui_times(folder / name, "poll")
            results[name].update(poll=poll, poll_1s=poll_1s, quit_after=quit_after, quit_during=quit_during)
    finally:
        for lock in locks:
            os.close(lock)
    return results


def compile_bytecode() -> None:
    for package in ("offloadlab", "offloadlab_tui"):
        compileall.compile_dir(Path(importlib.import_module(package).__file__).parent, quiet=1)


def gpu_hours(shape: Shape) -> float:
    return shape.gpus * shape.hours * len(shape.strategies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="6h-2gpu,24h-8gpu", help=f"Comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--folder", type=Path, help="Where the stores are built (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="Leave the stores there")
    args = parser.parse_args()
    names = args.shapes.split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}: choose from {', '.join(SHAPES)}")
    folder = args.folder or Path(tempfile.mkdtemp(prefix="long-run-ui-"))
    console = Console(width=80)
    compile_bytecode()
    try:
        for name in names:
            if not (folder / name / DB_NAME).exists():
                build(folder, name, SHAPES[name], console)
        print_results(console, measure(folder, names, console))
    finally:
        if not args.keep and args.folder is None:
            shutil.rmtree(folder)


def _cell(value: float | list[float], fmt: str | None) -> str:
    """A figure, or a repeated one's p50 and max (the ratio is of the p50s)."""
    if isinstance(value, list):
        return f"{fmt.format(statistics.median(value))} / {fmt.format(max(value))}"
    return f"{value / GiB:.2f}" if fmt is None else fmt.format(value)


def print_results(console: Console, results: dict) -> None:
    table = Table(
        title=f"seconds (p50 / max of {REPEATS}); the poll as a share of one core; ratio: the last store's p50s "
        "over the one before's"
    )
    table.add_column("", justify="left")
    for name in results:
        table.add_column(name, justify="right")
    if len(results) >= 2:
        table.add_column("ratio", justify="right")  # the last store's over the one before
    rows = (
        ("steps (all ranks)", "steps", "{:,}"), ("samples", "samples", "{:,}"), ("store GiB", "db_bytes", None),
        ("compare", "compare", "{:.2f}"), ("compare --json", "json", "{:.2f}"), ("report", "report", "{:.2f}"),
        ("TUI first frame", "first", "{:.2f}"), ("q in first read", "quit_during", "{:.2f}"),
        ("q after", "quit_after", "{:.2f}"), (f"TUI poll every {POLL_S:g} s", "poll", "{:.1%}"),
        ("TUI poll every 1 s", "poll_1s", "{:.1%}"),
    )  # fmt: skip
    for label, key, fmt in rows:
        values = [r[key] for r in results.values()]
        medians = [statistics.median(v) if isinstance(v, list) else v for v in values]
        cells = [_cell(v, fmt) for v in values]
        ratio = [f"{medians[-1] / medians[-2]:.2f}x" if medians[-2] else "-"] if len(values) >= 2 else []
        table.add_row(label, *cells, *ratio)
    console.print(table)
    for name, r in results.items():
        shape = SHAPES[name]
        per_gpu_hour = r["db_bytes"] / gpu_hours(shape) / 2**20
        console.print(f"{name}: {per_gpu_hour:.0f} MiB of store per GPU-hour ({shape.gpus} GPUs at {shape.hz:g} Hz)")


if __name__ == "__main__":
    main()
