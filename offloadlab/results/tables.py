"""How a run's figures are written for people: byte sizes, and `offloadlab compare`'s table."""

from __future__ import annotations

import io
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from offloadlab.results.status import Status, ran_to_its_end
from offloadlab.results.steps import PHASES
from offloadlab.results.summary import StrategySummary


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    """In the largest unit that is at least one: "40 s", "3 min", "13 h"."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{max(seconds, 0):.0f} s"


def ago(seconds: float) -> str:
    return f"{duration(seconds)} ago"


def fmt_or_dash(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def stalls(s: StrategySummary) -> Text:
    if s.stalls is None:
        return Text("-")
    return Text(f"{s.stalls} stall{'s' * (s.stalls != 1)}", style="bold red" if s.stalls else "")


def loss_deviation(s: StrategySummary) -> Text:
    """The last loss against exact AdamW's; an inexact strategy's is marked, however small."""
    if s.last_loss_deviation is None:
        return Text("-")
    return Text(f"{s.last_loss_deviation:+.2%}", style="" if s.exact else "yellow")


def share(used: float | None, capacity: float | None) -> str:
    """Use against capacity, as a percentage ("-" when either is unknown)."""
    return "-" if not used or not capacity else f"{used / capacity:.0%}"


def nvme_against_tuned(s: StrategySummary) -> tuple[str, str]:
    """("read / write" GB/s over a step, each as a share of what the tune measured on the drive)."""
    rates = s.nvme_gbps
    if rates is None:
        return "-", "-"
    shares = "-" if s.tuned_drive_gbps is None else " / ".join(map(share, rates, s.tuned_drive_gbps))
    return f"{rates[0]:.2f} / {rates[1]:.2f}", shares


def pcie_against_link(s: StrategySummary) -> tuple[str, str]:
    """("to GPU / to host" GB/s over the steady steps, each as a share of the link the plan measured)."""
    rates = s.pcie_gbps
    if rates is None:
        return "-", "-"
    link = s.planned.pcie_link_gbps if s.planned else None
    return f"{rates[0]:.1f} / {rates[1]:.1f}", "-" if link is None else " / ".join(map(share, rates, link))


def against_plan(s: StrategySummary) -> tuple[str, str]:
    """(the plan's step in seconds, the measured mean step over it)."""
    if s.planned is None:
        return "-", "-"
    ratio = s.step_against_plan
    return fmt_or_dash(s.planned.step_s, "{:.3g}"), fmt_or_dash(ratio, "{:.2f}x")


def bound_by(s: StrategySummary) -> str:
    """Where the step goes: "optimizer 84%"."""
    if s.bound_by is None:
        return "-"
    name, fraction = s.bound_by
    return f"{name} {fraction:.0%}"


def phase_shares(s: StrategySummary) -> str:
    """Forward, backward and optimizer as shares of the step ("other" is the rest): "8/8/84"."""
    if not s.phase_seconds:
        return "-"
    total = sum(s.phase_seconds.values()) or 1.0
    return "/".join(f"{100 * s.phase_seconds[p] / total:.0f}" for p in PHASES)


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[StrategySummary], Text | str]
    width: int
    """The terminal width from which the column is shown: 0 always, 120, 160 and 200 for the wider layouts."""
    text: bool = False


def _status(s: StrategySummary) -> Text:
    status = s.status.label + ("" if s.status is Status.DONE else f" ({s.steps_done}/{s.steps_planned})")
    if s.reason and s.status is not Status.DONE:
        status += f": {s.reason}"
    return Text(status, style=s.status.style)


def _two(top: Text | str, bottom: Text | str) -> Text:
    return Text.assemble(top, "\n", bottom)


COLUMNS = (
    Column("strategy", lambda s: Text.assemble(s.name, ("\n" + s.engine, "dim")), 0, text=True),
    Column("status", _status, 0, text=True),
    Column(
        "step s\np50 / p90",
        lambda s: _two(fmt_or_dash(s.median_step_time_s, "{:.3f}"), fmt_or_dash(s.p90_step_time_s, "{:.3f}")),
        0,
    ),
    Column("max s\nstalls", lambda s: _two(fmt_or_dash(s.max_step_time_s, "{:.2f}"), stalls(s)), 120),
    Column(
        "tokens/s\npractical",
        lambda s: _two(fmt_or_dash(s.tokens_per_s, "{:,.0f}"), fmt_or_dash(s.practicality, "{:.0%}")),
        0,
    ),
    Column("MFU\nΔ loss", lambda s: _two(fmt_or_dash(s.mfu_percent, "{:.1f}%"), loss_deviation(s)), 120),
    Column("bound by\nfwd/bwd/opt %", lambda s: _two(bound_by(s), phase_shares(s)), 120),
    Column(
        "GPU peak\nhost RSS",
        lambda s: _two(human_bytes(s.peak_allocated_bytes), human_bytes(s.host_rss_peak_bytes)),
        0,
    ),
    Column(
        "GPU resv\nof GPU/RAM",
        lambda s: _two(
            human_bytes(s.peak_reserved_bytes),
            f"{share(s.peak_reserved_bytes, s.gpu_memory_bytes)}/{share(s.host_rss_peak_bytes, s.host_memory_bytes)}",
        ),
        160,
    ),
    Column(
        "NVMe/step\nread / write",
        lambda s: _two(human_bytes(s.disk_read_bytes_per_step), human_bytes(s.disk_write_bytes_per_step)),
        120,
    ),
    Column(
        "GPU idle\nNVMe wait",
        lambda s: _two(
            fmt_or_dash(None if s.gpu_idle_share is None else 100 * s.gpu_idle_share, "{:.0f}%"),
            fmt_or_dash(s.nvme_wait_share, "{:.0%}"),
        ),
        160,
    ),
    Column("PCIe GB/s\nof link", lambda s: _two(*pcie_against_link(s)), 160),
    Column("opt threads\nM params/s", lambda s: _two(fmt_or_dash(s.cpu_threads, "{}"), optimizer_rate(s)), 240),
    Column("plan s\nstep/plan", lambda s: _two(*against_plan(s)), 200),
    Column(
        "comm/step\nbytes / s",
        lambda s: _two(human_bytes(s.comm_bytes_per_step), fmt_or_dash(s.comm_seconds_per_step, "{:.3f}")),
        200,
    ),
    Column("NVMe GB/s\nof tuned", lambda s: _two(*nvme_against_tuned(s)), 200),
    Column(
        "SSD writes\n/10k steps",
        lambda s: human_bytes(None if s.disk_write_bytes_per_step is None else 1e4 * s.disk_write_bytes_per_step),
        200,
    ),
    Column(
        "checkpoint",
        lambda s: {True: Text("verified", "green"), False: Text("FAILED", "red"), None: Text("-")}[
            s.checkpoint_verified
        ],
        0,
        text=True,
    ),
)


def optimizer_rate(s: StrategySummary) -> str:
    """Rank 0's optimizer: millions of parameters stepped a second in its phase of a steady step."""
    rate = s.optimizer_params_per_s
    return "-" if rate is None else f"{rate / 1e6:,.0f}"


SWAPPED_NOTHING_WHY = (
    "DeepSpeed keeps in RAM any tensor under max(1 MiB, the aio block_size) and the parameters its "
    "max_in_cpu buffer holds (1e9 elements by default): all of this model's stayed there"
)


def compare_table(
    run_dir: Path, summaries: list[StrategySummary], width: int = 200, state: str | None = None
) -> Table:
    """The strategies side by side, with the columns a terminal `width` wide has room for: the step, the
    throughput and memory always; stalls, MFU, loss, where the step goes and NVMe from 120; GPU idle and
    the share of the step spent waiting for NVMe swaps, reserved, memory against the GPU's and the host's,
    PCIe (to the GPU / to the host) against the link from 160; the step against the plan's (`run --plan`),
    comm, NVMe GB/s against the tune's and SSD wear from 200. Where long names leave too little room, the
    last columns of the widest layout go first.
    `state`, said in the title: a run that has not finished, and its last update."""
    columns = [c for c in COLUMNS if width >= c.width]
    while _natural_width(_table(run_dir, summaries, columns, width, state, folded=True)) > width and any(
        c.width for c in columns
    ):
        columns.remove(max(reversed([c for c in columns if c.width]), key=lambda c: c.width))
    return _table(run_dir, summaries, columns, width, state)


def _natural_width(table: Table) -> int:
    console = Console(width=10_000, file=io.StringIO())
    return Measurement.get(console, console.options, table).maximum


def _table(
    run_dir: Path,
    summaries: list[StrategySummary],
    columns: list[Column],
    width: int,
    state: str | None,
    folded: bool = False,
) -> Table:
    """`folded`: the status column no wider than its least, as the reasons fold when the table is measured."""
    # Text from the store and paths (a reason quoting "[rank0]", a folder named "[x]") is never read as markup.
    narrow = width < 120
    status_width = 12 if width >= 160 else len("status")
    table = Table(
        title=Text(f"offloadlab compare {run_dir}" + (f" ({state})" if state else "")),
        header_style="bold",
        box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
        padding=(0, 0, 0, 1),
    )
    for c in columns:
        table.add_column(
            c.header,
            justify="left" if c.text else "right",
            no_wrap=c.header != "status",
            overflow="fold",
            # The status holds a failure's reason: wide layouts keep it readable, not folded a word a line.
            min_width=status_width if c.header == "status" else None,
            max_width=status_width if c.header == "status" and folded else None,
        )
    for s in summaries:
        table.add_row(*(c.cell(s) for c in columns))
    captions = []
    stored = next((s.practicality_baseline for s in summaries if "/" in (s.practicality_baseline or "")), None)
    if stored:
        captions.append(f"practical: tokens/s over {stored}'s, stored beside this run (same model, batch, GPU)")
    budget = next((s.gpu_budget_bytes for s in summaries if s.gpu_budget_bytes), None)
    if budget:
        captions.append(f"GPU memory budget {human_bytes(budget)} a rank: GPU shares are of it")
    swapped_nothing = [s.name for s in summaries if s.swapped_nothing]
    if swapped_nothing:
        captions.append(f"{', '.join(swapped_nothing)} swapped nothing: {SWAPPED_NOTHING_WHY}")
    if captions:
        table.caption = Text("; ".join(captions))
    return table


@dataclass(frozen=True)
class RunListed:
    """One run of a folder of runs, as `compare FOLDER` lists it."""

    path: Path
    name: str
    status: str
    created_at: float
    strategies_done: int
    strategies_total: int


def list_runs(folder: Path) -> list[RunListed]:
    """The runs directly in folder, newest first; a store that cannot be read is listed with why."""
    from offloadlab.results.store import RunStore, StoreError, runs_in

    listed = []
    for path in runs_in(folder):
        try:
            store = RunStore(path)
            try:
                run = store.run()
                rows = store.strategies(run["id"])
                done = sum(ran_to_its_end(Status(r["status"]), r["reason"]) for r in rows)
                listed.append(
                    RunListed(path, run["name"], str(store.run_status()), run["created_at"], done, len(rows))
                )
            finally:
                store.close()
        except (StoreError, LookupError, sqlite3.DatabaseError) as err:
            listed.append(RunListed(path, "?", f"unreadable: {err}", path.stat().st_mtime, 0, 0))
    return listed


def runs_table(folder: Path, runs: list[RunListed]) -> Table:
    title = f"{len(runs)} run{'' if len(runs) == 1 else 's'} in {folder}"
    table = Table(title=title, caption="offloadlab compare RUN for one", box=box.SIMPLE)
    for column in ("run", "name", "status", "started (UTC)", "strategies done"):
        table.add_column(column, no_wrap=column != "status", overflow="fold")
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.created_at))
        table.add_row(r.path.name, r.name, r.status, started, f"{r.strategies_done}/{r.strategies_total}")
    return table
