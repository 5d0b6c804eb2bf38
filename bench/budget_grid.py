"""No false fits: the plan's verdicts around the largest GPT under a GPU budget, each run for real.

    python bench/budget_grid.py --plan PLAN.json --spec WRITTEN.toml --gpu-mem G --out DIR
                                [--around 1] [--placements 3] [--steps 4] [--timeout 420] [--stop-by S]
                                [--dry-run]

PLAN.json and WRITTEN.toml come from `offloadlab plan --largest --gpu-mem G --json --write W` on the machine
that runs the grid (the plan's machine and links; the written spec's batch, precision and budget). The grid
is the largest GPT's width with AROUND layers fewer to AROUND more, times the PLACEMENTS placements that
come closest to fitting the largest (those that fit, fastest first, then the least over). Each cell is run
with `offloadlab run --force` under the budget for STEPS steps (the peaks come in the first step, where the
optimizer's states are made). A cell the plan says fits must train; one it says does not fit must end
"does not fit". The table says where they agree; DIR/grid.json holds every cell, written after each one,
so the same command run again goes on where a stopped grid left off (a cell stopped by Ctrl-C is removed
and run again). --stop-by S stops it, as Ctrl-C would, before a cell that would end after S seconds from
the start, judged by the longest cell the grid has timed (for calls of a fixed length: no cell is cut).
Pointed at a finished grid's folder (one unpacked from bench/results), it runs nothing and judges the
recorded runs again with the planner as it is; --dry-run runs nothing either, and judges what DIR holds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomli_w
from rich.console import Console
from rich.table import Table

from offloadlab.engines.deepspeed.buffers import buffers_for
from offloadlab.plan.accounting import GiB, Links, Machine, Placement, shape_of_spec
from offloadlab.plan.output import run_spec_for
from offloadlab.plan.predict import Prediction, plan, predict
from offloadlab.results.rundir import RunDir
from offloadlab.results.status import Status
from offloadlab.results.store import RunStore
from offloadlab.results.summary import summarize
from offloadlab.spec import RunSpec, load_spec


@dataclass
class Cell:
    n_layers: int
    n_params: int
    planned: Prediction
    status: str = "not run"
    outcome: str = ""
    gpu_allocated_gib: float | None = None  # the run's peaks, where its telemetry got them
    gpu_reserved_gib: float | None = None
    host_rss_gib: float | None = None
    seconds: float | None = None  # from its run's start to its end, where this grid timed it

    @property
    def name(self) -> str:
        """Its run folder's name, and its spec's and log's stem."""
        return f"{self.n_layers}-{self.planned.placement.name}"

    @property
    def agrees(self) -> bool | None:
        """Whether the run says what the plan said; None where the run settled nothing."""
        if self.status == Status.DONE.value:
            return self.planned.fits
        if self.status == Status.DOES_NOT_FIT.value:
            return not self.planned.fits
        return None


def closest_placements(predictions: list[Prediction], count: int) -> list[Placement]:
    """Those that fit, fastest first (the plan's order), then those that do not, the least over first."""
    fitting = [x for x in predictions if x.fits]
    over = sorted((x for x in predictions if not x.fits), key=lambda x: x.use)
    return [x.placement for x in (fitting + over)[:count]]


def with_layers(spec: RunSpec, n_layers: int) -> RunSpec:
    return spec.model_copy(update={"model": spec.model.model_copy(update={"n_layers": n_layers})})


def grid_cells(
    spec: RunSpec, machine: Machine, links: Links, around: int, count: int, among: set[str] | None = None
) -> list[Cell]:
    """The plan for each cell: sizes by layer count around the spec's, the same placements at each. among:
    the placement names to choose from (a grid already begun keeps its own, whatever the planner adds)."""
    shape = shape_of_spec(spec)
    predictions = [
        x for x in plan(shape, machine, links, buffers_for(shape)) if not among or x.placement.name in among
    ]
    placements = closest_placements(predictions, count)
    cells = []
    for n_layers in range(spec.model.n_layers - around, spec.model.n_layers + around + 1):
        sized = shape_of_spec(with_layers(spec, n_layers))
        for p in placements:
            cells.append(Cell(n_layers, sized.n_params, predict(p, sized, machine, links, buffers_for(sized))))
    return cells


def cell_spec(spec: RunSpec, cell: Cell, steps: int) -> dict:
    raw = run_spec_for(spec, cell.planned, None, buffers_for(shape_of_spec(with_layers(spec, cell.n_layers))))
    raw["model"]["n_layers"] = cell.n_layers
    raw.update(steps=steps, verify_checkpoint=False, name=f"grid-{cell.n_layers}-{cell.planned.placement.name}")
    return raw


def remove_attempt(spec_file: Path, out: Path) -> None:
    """What a cell's attempt wrote: its spec, its log and its run folder (all named by this grid)."""
    spec_file.unlink(missing_ok=True)
    out.with_suffix(".log").unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)


def run_cell(cell: Cell, spec_file: Path, gpu_mem: float, out: Path, timeout_s: float) -> None:
    command = [sys.executable, "-m", "offloadlab.cli", "run", str(spec_file), "--gpu-mem", str(gpu_mem)]
    log_path = out.with_suffix(".log")
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*command, "--force", "--out", str(out)], stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # as Ctrl-C: the CLI stops the run and removes what it made
            proc.wait()
            cell.status, cell.outcome = "timed out", f"still running after {timeout_s:.0f} s"
            return
        except KeyboardInterrupt:  # Ctrl-C (or `timeout -s INT`) reaches the run's process group too
            proc.wait()
            remove_attempt(spec_file, out)  # the run keeps its store; the cell is run again when resumed
            raise
    cell.seconds = time.monotonic() - started
    read_run(cell, out)


def read_run(cell: Cell, out: Path) -> None:
    (summary,) = summarize(RunStore(out))
    cell.status = summary.status.value
    cell.outcome = f"trained {summary.steps_done} steps" if summary.status is Status.DONE else summary.reason or ""
    peaks = (summary.peak_allocated_bytes, summary.peak_reserved_bytes, summary.host_rss_peak_bytes)
    cell.gpu_allocated_gib, cell.gpu_reserved_gib, cell.host_rss_gib = (x / GiB if x else None for x in peaks)


def placements_begun(out: Path) -> set[str] | None:
    """The placements of the grid in `out`, if one was begun there."""
    grid_json = out / "grid.json"
    if not grid_json.exists():
        return None
    return {r["placement"] for r in json.loads(grid_json.read_text())["cells"]}


def resume(cells: list[Cell], out: Path, gpu_mem: float) -> None:
    """Takes the outcome of each cell an earlier run of the same grid settled: read again from its run's
    store where that is still there (so the grid can be re-read against another planner), else as recorded."""
    grid_json = out / "grid.json"
    if not grid_json.exists():
        return
    earlier = json.loads(grid_json.read_text())
    if earlier["gpu_mem_gib"] != gpu_mem:
        sys.exit(f"{grid_json} is a grid at {earlier['gpu_mem_gib']:g} GiB, not {gpu_mem:g}: pass another --out")
    ran = {(r["n_layers"], r["placement"]): r for r in earlier["cells"] if r["status"] != "not run"}
    for c in cells:
        row = ran.get((c.n_layers, c.planned.placement.name))
        if row is None:
            continue
        run_dir = out / c.name
        if RunDir.at(run_dir).store_path.exists():
            read_run(c, run_dir)
        else:
            c.status, c.outcome = row["status"], row["outcome"]
            c.gpu_allocated_gib, c.gpu_reserved_gib = row.get("gpu_allocated_gib"), row["gpu_reserved_gib"]
            c.host_rss_gib = row["host_rss_gib"]
        c.seconds = row.get("seconds")


def write_grid(cells: list[Cell], gpu_mem: float, grid_json: Path) -> None:
    rows = [
        dict(n_layers=c.n_layers, n_params=c.n_params, placement=c.planned.placement.name, fits=c.planned.fits,
             binding=c.planned.binding, gpu_gib=c.planned.memory.gpu_bytes / GiB,
             host_gib=c.planned.memory.host_bytes / GiB, status=c.status, outcome=c.outcome, agrees=c.agrees,
             gpu_allocated_gib=c.gpu_allocated_gib, gpu_reserved_gib=c.gpu_reserved_gib, host_rss_gib=c.host_rss_gib,
             seconds=c.seconds)
        for c in cells
    ]  # fmt: skip
    grid_json.write_text(json.dumps({"gpu_mem_gib": gpu_mem, "cells": rows}, indent=2))


def grid_table(cells: list[Cell], gpu_mem: float) -> Table:
    """One row a cell, for 80 columns: the plan's verdict names its constraints (their figures are in the
    memory columns, planned -> measured peak), the run's says how it ended."""
    table = Table(title=f"no false fits: {gpu_mem:g} GiB budget", header_style="bold")
    for col in ("GPT", "placement", "plan", "run", "GPU GiB", "host GiB", "agree"):
        table.add_column(col, overflow="fold")
    for c in cells:
        ended = c.outcome.split(":")[0]  # "killed by the kernel's OOM killer (host RAM)", not its evidence
        status = c.status.replace("_", " ")
        run = ended if c.status == Status.DONE.value else f"{status}: {ended}" if ended else status
        gpu, host = (f"{x:.1f}" if x is not None else "-" for x in (c.gpu_allocated_gib, c.host_rss_gib))
        table.add_row(
            f"{c.n_params / 1e9:.2f}B\n{c.n_layers} layers",
            c.planned.placement.name,
            ("fits" if c.planned.fits else "no") + f": {c.planned.binds}",
            run,
            f"{c.planned.memory.gpu_bytes / GiB:.1f}\n-> {gpu}",
            f"{c.planned.memory.host_bytes / GiB:.1f}\n-> {host}",
            {True: "[green]yes[/]", False: "[red]NO[/]", None: "-"}[c.agrees],
        )
    return table


def out_of_time(cells: list[Cell], started: float, stop_by: float | None) -> bool:
    """Whether the next cell, taking as long as the longest one timed so far, would end after stop_by."""
    timed = [c.seconds for c in cells if c.seconds is not None]
    return stop_by is not None and bool(timed) and time.monotonic() - started + max(timed) > stop_by


def run_grid(cells: list[Cell], spec: RunSpec, args: argparse.Namespace, console: Console) -> None:
    started = time.monotonic()
    for i, cell in enumerate(cells, 1):
        if cell.status != "not run":
            continue
        if out_of_time(cells, started, args.stop_by):
            raise KeyboardInterrupt  # stops as Ctrl-C between cells would: the settled ones are in grid.json
        console.print(f"[{i}/{len(cells)}] {cell.n_layers} layers, {cell.planned.placement.name}")
        spec_file, run_dir = args.out / f"{cell.name}.toml", args.out / cell.name
        remove_attempt(spec_file, run_dir)  # one stopped by a kill, not settled in grid.json
        spec_file.write_text(tomli_w.dumps(cell_spec(spec, cell, args.steps)))
        run_cell(cell, spec_file, args.gpu_mem, run_dir, args.timeout)
        console.print(f"  {cell.status}: {cell.outcome}")
        write_grid(cells, args.gpu_mem, args.out / "grid.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="`plan --largest --gpu-mem G --json` from here")
    parser.add_argument("--spec", type=Path, required=True, help="the spec that plan's --write wrote")
    parser.add_argument("--gpu-mem", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--around", type=int, default=1, help="layers fewer and more than the largest")
    parser.add_argument("--placements", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=420, help="seconds a cell's run may take")
    parser.add_argument("--stop-by", type=float, help="seconds from now by which the grid stops (no cell cut)")
    parser.add_argument("--dry-run", action="store_true", help="run nothing: judge what --out holds, if anything")
    args = parser.parse_args()
    planned = json.loads(args.plan.read_text())
    machine, links = Machine(**planned["machine"]), Links(**planned["links"])
    spec = load_spec(args.spec)
    cells = grid_cells(spec, machine, links, args.around, args.placements, placements_begun(args.out))
    console = Console()
    resume(cells, args.out, args.gpu_mem)
    if not args.dry_run:
        args.out.mkdir(parents=True, exist_ok=True)
        grid_json = args.out / "grid.json"
        write_grid(cells, args.gpu_mem, grid_json)
        try:
            run_grid(cells, spec, args, console)
        except KeyboardInterrupt:
            console.print(grid_table(cells, args.gpu_mem))
            sys.exit(f"interrupted: the settled cells are in {grid_json}; the same command goes on from them")
    console.print(grid_table(cells, args.gpu_mem))


if __name__ == "__main__":
    main()
