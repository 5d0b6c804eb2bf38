"""`offloadlab report RUN_DIR`: one self-contained HTML page (matplotlib's SVG inline, no scripts, no network)
with compare's table, where each strategy's step goes, its loss and step times, and per metric its samples
against the machine's capacity, the strategies in rows on one scale."""

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
from matplotlib.ticker import FuncFormatter

from offloadlab.results.figures import STALL_FACTOR
from offloadlab.results.store import RunStore
from offloadlab.results.summary import StrategySummary, SummaryCache, summarize
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
"""Step boundaries are marked on the time axes of runs with at most this many steps."""


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    scale: float
    """Divide values by this for display (1e9 for GB/s)."""
    metrics: tuple[tuple[str, str], ...]
    """(sample metric LIKE pattern, legend label): one line each, and one per GPU of a gpu% pattern."""
    capacities: Callable[[StrategySummary], list[tuple[float | None, str]]] = lambda s: []
    """(value in the panel's unit before scaling, legend label) of each capacity drawn as a dashed line."""


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
    Panel("GPU utilization", "%", 1.0, (("gpu%.util(%)", "util"),)),
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
    """One row per strategy that has samples of the panel's metrics, all on one y scale so rows compare, x
    in time from the strategy's first step (startup is left of zero; steps are marked on short runs).
    None: no strategy has any, and the panel is left out."""
    lines_of = {}
    for row in strategies:
        lines = [
            (label, color, metric, points)
            for (pattern, label), color in zip(panel.metrics, COLORS)
            for metric, points in store.binned_samples(row["id"], pattern, MAX_POINTS, GAP_PERIODS).items()
        ]
        if lines:
            lines_of[row["id"]] = lines
    drawn = [row for row in strategies if row["id"] in lines_of]
    if not drawn:
        return None
    fig, axes = _figure(len(drawn))
    for ax in axes[1:]:
        ax.sharey(axes[0])
    span = 0.0
    for ax, row in zip(axes, drawn):
        steps = steps_of[row["id"]]
        ax.set_title(row["name"], loc="left", fontsize=9)
        ax.set_ylabel(panel.unit, fontsize=8)
        ax.tick_params(labelsize=7)
        lines = lines_of[row["id"]]
        origin = steps[0].t_start if steps else lines[0][3][0][0]
        per_gpu = len({metric for _, _, metric, _ in lines}) > len(panel.metrics)
        for label, color, metric, points in lines:
            x = np.array([t - origin for t, _ in points])
            y = np.array([np.nan if v is None else v / panel.scale for _, v in points])  # NaN: a break
            gpu = metric.split(".")[0]
            name = f"{label}, {gpu}" if per_gpu else label  # one line per GPU
            ax.plot(x, y, "-" if gpu in ("gpu0", "disk", "host") else ":", color=color, linewidth=1.2, label=name)
            span = max(span, x[-1])
        summary = summaries.get(row["name"])
        for (capacity, label), color in zip(panel.capacities(summary) if summary else [], COLORS):
            if capacity:
                ax.axhline(capacity / panel.scale, color=color, linestyle="--", linewidth=0.8, label=label)
        if steps and len(steps) <= STEP_MARKS:
            for r in steps:
                ax.axvline(r.t_start - origin, color="#dddddd", linewidth=0.5, zorder=0)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside, not over
        ax.set_ylim(bottom=0)
    clock = _clock_axis(span)
    for ax in axes:
        ax.xaxis.set_major_formatter(clock)
    axes[-1].set_xlabel(f"time from the first step ({clock.unit}; startup is left of 0)", fontsize=8)
    fig.subplots_adjust(right=0.8)  # the legends
    return fig


def _clock_axis(span_s: float) -> FuncFormatter:
    """Seconds as h:mm on runs of an hour or more, m:ss below."""
    if span_s >= 3600:
        clock = FuncFormatter(
            lambda x, _: f"{'-' if x < 0 else ''}{int(abs(x) // 3600)}:{int(abs(x) % 3600 // 60):02d}"
        )
        clock.unit = "h:mm"
    else:
        clock = FuncFormatter(lambda x, _: f"{'-' if x < 0 else ''}{int(abs(x) // 60)}:{int(abs(x) % 60):02d}")
        clock.unit = "m:ss"
    return clock


def step_time_chart(strategies: list, summaries: dict, steps_of: dict) -> Figure:
    """Each strategy's step times on its own scale, with its median and the stall line (3x the median)."""
    fig, axes = _figure(len(strategies), 1.4)
    for ax, row in zip(axes, strategies):
        steps = steps_of[row["id"]]
        ax.set_title(row["name"], loc="left", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_ylabel("s", fontsize=8)
        if not steps:
            ax.text(0.5, 0.5, "no steps", transform=ax.transAxes, ha="center", color="#888888")
            continue
        marker = "." if len(steps) <= STEP_MARKS else ""  # thousands of dots are one smear
        ax.plot([r.step for r in steps], [r.step_time_s for r in steps], marker + "-", color=COLORS[0], linewidth=1,
                markersize=2, label="step time")  # fmt: skip
        median = summaries[row["name"]].median_step_time_s
        if median:
            ax.axhline(median, color="#2ca02c", linewidth=0.8, label=f"median {median:.3g} s")
            ax.axhline(STALL_FACTOR * median, color="#d62728", linestyle="--", linewidth=0.8, label="stall line")
        ax.legend(fontsize=7, loc="upper right")
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("step", fontsize=8)
    return fig


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
    steps_of = {row["id"]: cache.strategies[row["id"]].rank0 for row in strategies}  # read once, for every chart
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
