"""`offloadlab report RUN_DIR`: one self-contained HTML page (matplotlib's SVG inline, no scripts, no network)
with compare's table, where each strategy's step goes, its loss and step times (rows on one scale), and a
chart per metric with every strategy on it against the machine's capacity."""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

from offloadlab.results.figures import STALL_FACTOR
from offloadlab.results.store import RunStore
from offloadlab.results.summary import StrategySummary, SummaryCache, rank0_steps, summarize
from offloadlab.results.tables import COLUMNS

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKERS = ("o", "s", "^", "v", "D", "x", "+", "*")
DASHES = ("-", "--", "-.", ":")
PHASE_COLORS = {"forward": "#1f77b4", "backward": "#9467bd", "optimizer": "#ff7f0e", "other": "#bbbbbb"}
MAX_POINTS = 600
"""A line is drawn from at most this many time bins, each the mean of its samples (a 3-hour run has 100k)."""
GAP_PERIODS = 3
"""A bin is at least this many sampling periods wide, so an empty bin is a real gap in the samples (drawn
as a break in the line), not a bin that fell between two samples."""
STEP_MARKS = 60
"""Each step is drawn as a dot on runs of at most this many steps."""


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    scale: float
    """Divide values by this for display (1e9 for GB/s)."""
    metrics: tuple[tuple[str, str], ...]
    """(sample metric LIKE pattern, legend label): a line each per strategy."""
    capacities: Callable[[StrategySummary], list[tuple[float | None, str]]] = lambda s: []
    """(value in the panel's unit before scaling, legend label) of each capacity drawn as a dashed line."""
    over_gpus: str = "sum"
    """How a gpu% pattern's GPUs make one line: "sum", "mean" or "max" (named in the chart's title)."""


def _gpu_memory(s: StrategySummary) -> list[tuple[float | None, str]]:
    return [(s.gpu_memory_bytes, "budget" if s.gpu_budget_bytes else "GPU's memory")]


def _pcie_link(s: StrategySummary) -> list[tuple[float | None, str]]:
    link = s.planned.pcie_link_gbps if s.planned else None
    return [] if link is None else [(link[0] * 1e9, "link to GPU (plan)"), (link[1] * 1e9, "link to host (plan)")]


def _tuned_drive(s: StrategySummary) -> list[tuple[float | None, str]]:
    rates = s.tuned_drive_gbps
    return [] if rates is None else [(rates[0] * 1e9, "tuned read"), (rates[1] * 1e9, "tuned write")]


PANELS = (
    Panel(
        "GPU memory used (NVML: the allocator's reserve, CUDA context and NCCL buffers; the table's peaks are the "
        "allocator's)",
        "GiB",
        2**30,
        (("gpu%.mem_used(B)", "used"),),
        _gpu_memory,
        over_gpus="max",
    ),
    Panel("PCIe", "GB/s", 1e9, (("gpu%.pcie_rx(B/s)", "to GPU"), ("gpu%.pcie_tx(B/s)", "to host")), _pcie_link),
    Panel("NVMe device", "GB/s", 1e9, (("disk.read(B/s)", "read"), ("disk.write(B/s)", "write")), _tuned_drive),
    Panel(
        "host RSS, process tree",
        "GiB",
        2**30,
        (("host.rss_tree(B)", "RSS"),),
        lambda s: [(s.host_memory_bytes, "RAM")],
    ),
    Panel("host CPU", "%", 1.0, (("host.cpu(%)", "all cores"),)),
    Panel("GPU utilization", "%", 1.0, (("gpu%.util(%)", "util"),), over_gpus="mean"),
)


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    # Text as text, which the browser draws: as glyph paths it was two thirds of a long run's report time.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _figure(rows: int, height: float = 1.7) -> tuple[Figure, list]:
    """Fixed margins in inches (a layout engine measured every label of every axes twice: most of a long
    run's report time)."""
    total = 0.75 + height * rows
    fig = Figure(figsize=(9.5, total))
    fig.subplots_adjust(left=0.07, right=0.98, top=1 - 0.3 / total, bottom=0.45 / total, hspace=0.55 / height)
    return fig, list(fig.subplots(rows, 1, squeeze=False)[:, 0])


def metric_chart(store: RunStore, panel: Panel, strategies: list, summaries: dict, steps_of: dict) -> Figure | None:
    """Every strategy's samples of the panel's metrics on one axes, a colour each (the loss chart's), x in
    time from each strategy's first step (startup is left of zero), so hours of runs compare at a glance.
    A metric of every GPU is one line, combined over the GPUs as the title says. A capacity far above
    the data is named in the legend, not drawn (it flattened the lines). None: no samples, no chart."""
    series, gpus = [], 0
    for i, row in enumerate(strategies):
        steps = steps_of[row["id"]]
        for j, (pattern, label) in enumerate(panel.metrics):
            binned = store.binned_samples(row["id"], pattern, MAX_POINTS, GAP_PERIODS)
            if binned:
                gpus = max(gpus, len(binned)) if pattern.startswith("gpu%") else gpus
                x, y = _combined(list(binned.values()), panel.over_gpus)
                origin = steps[0].t_start if steps else x[0]
                name = row["name"] if steps else f"{row['name']} (no steps: from its first sample)"
                series.append((i, name, j, label, x - origin, y / panel.scale))
    if not series:
        return None
    fig, (ax,) = _figure(1, 2.4)
    several = len(panel.metrics) > 1
    for i, name, j, label, x, y in series:
        ax.plot(x, y, DASHES[j % len(DASHES)], color=COLORS[i % len(COLORS)], linewidth=1.2,
                label=f"{name}: {label}" if several else name)  # fmt: skip
    top = max(float(np.nanmax(y)) if np.isfinite(y).any() else 0.0 for *_, y in series)
    # A sum over N GPUs is held against N links (a capacity is one GPU's, or one link's).
    times = gpus if panel.over_gpus == "sum" and gpus > 1 else 1
    for k, (capacity, label) in enumerate(_capacities(panel, [summaries.get(r["name"]) for r in strategies])):
        value = times * capacity / panel.scale
        label = f"{label} x {times}" if times > 1 else label
        shown = value <= 2.5 * top or not top
        ax.plot([], [], ":" if k % 2 else "--", color="#555555", linewidth=0.9,
                label=f"{label} {value:.3g} {panel.unit}" + ("" if shown else ", above the scale"))  # fmt: skip
        if shown:
            ax.axhline(value, color="#555555", linestyle=":" if k % 2 else "--", linewidth=0.9)
    how = f", {panel.over_gpus} of {gpus} GPUs" if gpus > 1 else ""
    ax.set_title(f"{panel.title}{how}", loc="left", fontsize=9)
    ax.set_ylabel(panel.unit, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    unit = _time_axis(ax, max(float(x[-1]) for *_, x, _ in series) - min(float(x[0]) for *_, x, _ in series))
    ax.set_xlabel(f"time from each strategy's first step ({unit}; startup is left of 0)", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside, not over
    fig.subplots_adjust(right=0.72)
    return fig


def _combined(lines: list[list[tuple[float, float | None]]], how: str) -> tuple[np.ndarray, np.ndarray]:
    """One line of several metrics' bins (a GPU each): (x, y) on the first's bin centres, NaN in a gap."""
    x = np.array([t for t, _ in lines[0]])
    ys = []
    for points in lines:
        t = np.array([t for t, _ in points])
        v = np.array([np.nan if v is None else v for _, v in points])
        ys.append(v if len(t) == len(x) and np.allclose(t, x) else np.interp(x, t, v))
    return x, getattr(np, how)(np.vstack(ys), axis=0)


def _capacities(panel: Panel, summaries: list) -> list[tuple[float, str]]:
    """The capacities of the strategies' machines (the same machine: drawn once), in order."""
    seen: dict[tuple[float, str], None] = {}
    for summary in summaries:
        for capacity, label in panel.capacities(summary) if summary else []:
            if capacity:
                seen.setdefault((capacity, label))
    return list(seen)


TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""Seconds between time ticks, the first that gives at most 8 (5:00, 10:00 or 1:00, 2:00; not 1:23, 2:46)."""


def _time_axis(ax, span_s: float) -> str:
    """Ticks at round times over the axis' whole span (start-up included), labelled h:mm where that is an
    hour or more, m:ss below; returns which."""
    step = next((s for s in TICK_STEPS_S if span_s / s <= 8), TICK_STEPS_S[-1])
    ax.xaxis.set_major_locator(MultipleLocator(step))
    hours = span_s >= 3600
    size, small = (3600, 60) if hours else (60, 1)
    sign = lambda x: "-" if x < 0 else ""  # noqa: E731
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda x, _: f"{sign(x)}{int(abs(x) // size)}:{int(abs(x) % size // small):02d}")
    )
    return "h:mm" if hours else "m:ss"


def step_time_chart(strategies: list, summaries: dict, steps_of: dict) -> Figure:
    """Each strategy's step times in its own row, every row on one scale so they compare, with its median and
    the stall line (3x the median). The scale ends 10% above the highest of the rows' slowest steps, each
    taken no higher than its own stall line: a step above the scale (a start-up, a stall of minutes) is a
    red mark at the top, counted in the legend, and a stall line above it is named there."""
    fig, axes = _figure(len(strategies), 1.4)
    top = 1.1 * max((_natural_top(steps_of[r["id"]], summaries[r["name"]]) for r in strategies), default=1.0)
    for ax, row in zip(axes, strategies):
        steps = steps_of[row["id"]]
        ax.set_title(row["name"], loc="left", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_ylabel("s", fontsize=8)
        ax.set_ylim(0, top)
        if not steps:
            ax.text(0.5, 0.5, "no steps", transform=ax.transAxes, ha="center", color="#888888")
            continue
        marker = "." if len(steps) <= STEP_MARKS else ""  # thousands of dots are one smear
        x = np.array([r.step for r in steps])
        y = np.array([r.step_time_s for r in steps])
        ax.plot(x, np.minimum(y, top), marker + "-", color=COLORS[0], linewidth=1, markersize=2, label="step time")
        above = y > top
        if above.any():
            ax.plot(x[above], np.full(above.sum(), top), "^", color="#d62728", markersize=4, clip_on=False,
                    label=f"{above.sum()} above the scale (max {y.max():.3g} s)")  # fmt: skip
        median = summaries[row["name"]].median_step_time_s
        if median:
            ax.axhline(median, color="#2ca02c", linewidth=0.8, label=f"median {median:.3g} s")
            stall = STALL_FACTOR * median
            if stall <= top:
                ax.axhline(stall, color="#d62728", linestyle="--", linewidth=0.8, label="stall line")
            else:  # named, not drawn: another row's slowest step set the scale below it
                ax.plot([], [], "--", color="#d62728", linewidth=0.8, label=f"stall line {stall:.3g} s, above")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel("step", fontsize=8)
    fig.subplots_adjust(right=0.72)
    return fig


def _natural_top(steps: list, summary: StrategySummary) -> float:
    """Where a strategy's row would end on its own: its slowest step, or its stall line if a stall is higher."""
    slowest = max((r.step_time_s for r in steps), default=0.0)
    median = summary.median_step_time_s
    return min(slowest, STALL_FACTOR * median) if median else slowest


def loss_chart(strategies: list, steps_of: dict) -> Figure:
    """Every strategy's loss per step on one chart, with a legend: an inexact strategy (ZenFlow) against
    the exact ones at every step."""
    fig, (ax,) = _figure(1, 2.6)
    drawn = False
    for i, (row, color) in enumerate(zip(strategies, COLORS)):
        steps = steps_of[row["id"]]
        if steps:
            # Exact strategies' losses are equal: each its own marker and dash, so one does not hide the rest.
            style = dict(
                marker=MARKERS[i % len(MARKERS)], linestyle=DASHES[i % len(DASHES)], markevery=max(1, len(steps) // 12)
            )
            ax.plot([r.step for r in steps], [r.loss for r in steps], color=color, linewidth=1.2, markersize=4,
                    fillstyle="none", label=row["name"], **style)  # fmt: skip
            drawn = True
    if drawn:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        fig.subplots_adjust(right=0.8)
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("loss", fontsize=8)
    ax.tick_params(labelsize=7)
    return fig


def phase_chart(summaries: list[StrategySummary]) -> Figure | None:
    """Where each strategy's steady step goes: forward, backward, optimizer and the rest, stacked, each
    with the part of it spent waiting for NVMe swaps hatched."""
    timed = [s for s in summaries if s.phase_seconds]
    if not timed:
        return None
    fig, (ax,) = _figure(1, 0.35 * len(timed) + 0.6)
    names = [s.name for s in timed]
    left = np.zeros(len(timed))
    for phase, color in PHASE_COLORS.items():
        seconds = np.array([s.phase_seconds[phase] for s in timed])
        waiting = np.array([s.nvme_waiting_in(phase) for s in timed])
        ax.barh(names, seconds, left=left, color=color, label=phase)
        ax.barh(names, waiting, left=left + seconds - waiting, color="none", hatch="////", linewidth=0)
        left += seconds
    for y, s in enumerate(timed):
        phase, share = s.bound_by
        waited = "" if s.nvme_wait_share is None else f" (NVMe wait {s.nvme_wait_share:.0%})"
        ax.text(left[y], y, f"  {phase} {share:.0%}{waited}", va="center", fontsize=7)
    fig.subplots_adjust(left=0.2)  # the strategies' names
    ax.invert_yaxis()
    ax.set_xlabel("seconds per steady step (mean)", fontsize=8)
    ax.tick_params(labelsize=7)
    waited = any(s.nvme_wait_seconds for s in timed)
    ax.set_xlim(right=left.max() * (1.5 if waited else 1.25))  # room after the bars for the verdicts
    handles, labels = ax.get_legend_handles_labels()
    if waited:
        handles.append(Patch(facecolor="none", hatch="////", label="NVMe wait"))
        labels.append("NVMe wait")
    # Above the bars: inside the axes it covered the last strategy's.
    ax.legend(handles, labels, fontsize=7, ncols=5, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def _summary_table(summaries: list[StrategySummary]) -> str:
    """compare's table, every column (the widest layout), each cell's lines as in the terminal."""

    def cell(text) -> str:
        plain = text.plain if hasattr(text, "plain") else str(text)
        return "<br>".join(html.escape(line) for line in plain.splitlines())

    head = "".join(f"<th>{cell(c.header)}</th>" for c in COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{cell(c.cell(s))}</td>" for c in COLUMNS) + "</tr>" for s in summaries)
    return f"<table><tr>{head}</tr>{rows}</table>"


NO_PHASES = "<p>no phase timings recorded</p>"  # the one chart that may be missing (a store before phases)


def write_report(run_dir: Path, out: Path, png_dir: Path | None = None) -> list[Path]:
    """The HTML page at `out`; with png_dir, each chart also as a PNG there (the files written)."""
    store = RunStore(run_dir)
    run = store.run()
    strategies = store.strategies(run["id"])
    cache = SummaryCache()
    summaries = summarize(store, cache)
    by_name = {s.name: s for s in summaries}
    steps_of = {row["id"]: rank0_steps(store, cache, row["id"]) for row in strategies}  # read once, for every chart
    charts = {
        "where the step goes": phase_chart(summaries),
        "loss per step": loss_chart(strategies, steps_of),
        "step time": step_time_chart(strategies, by_name, steps_of),
    }
    panels = {panel.title: metric_chart(store, panel, strategies, by_name, steps_of) for panel in PANELS}
    sections = [f"<h2>{html.escape(title)}</h2>{_svg(fig)}" for title, fig in panels.items() if fig]
    if len(sections) < len(panels):
        left_out = ", ".join(title.split(" (")[0] for title, fig in panels.items() if not fig)
        sections.append(f"<p>no samples of: {html.escape(left_out)}</p>")
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>offloadlab report: {html.escape(run['name'])}</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:1400px}}table{{border-collapse:collapse;font-size:12px}}
.wide{{overflow-x:auto}} td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right;vertical-align:top;
white-space:nowrap}}
td:first-child,td:nth-child(2){{text-align:left}} svg{{max-width:100%;height:auto}}</style></head><body>
<h1>offloadlab report: {html.escape(run['name'])}</h1><p>run directory {html.escape(str(run_dir))},
status {html.escape(store.run_status())}.
Step figures leave out the first step; tokens/s is tokens over the time of all the other steps;
practicality is tokens/s over the fastest strategy's here that offloads nothing (or, for a run without
one, a stored run's of the same model, batch and GPU: the table's "practical" caption in compare names it);
a stall is a step over
{STALL_FACTOR:g}x the median. Each cell's second line is the header's second line.</p>
<div class="wide">{_summary_table(summaries)}</div>
{''.join(f"<h2>{html.escape(title)}</h2>{_svg(fig) if fig else NO_PHASES}" for title, fig in charts.items())}
{''.join(sections)}
</body></html>"""
    out.write_text(page)
    if png_dir is None:
        return [out]
    png_dir.mkdir(parents=True, exist_ok=True)
    written = [out]
    for title, fig in [*charts.items(), *panels.items()]:
        if fig is not None:
            name = re.sub(r"[^a-z0-9]+", "-", title.split(" (")[0].lower()).strip("-")  # the title, not its note
            written.append(png_dir / f"{name}.png")
            fig.savefig(written[-1], dpi=110)
    return written
