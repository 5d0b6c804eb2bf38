"""`offloadlab report RUN_DIR`: one self-contained HTML page (inline SVG, no scripts, no network) with the
comparison table and, per metric, each strategy's series side by side on a shared y scale."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from offloadlab.results.status import Status
from offloadlab.results.store import RunStore
from offloadlab.results.summary import StrategySummary, summarize
from offloadlab.results.tables import fmt_or_dash, human_bytes

WIDTH, HEIGHT, PAD = 320, 170, 36
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    scale: float
    """Divide values by this for display (1e9 for GB/s)."""
    metrics: tuple[str, ...]
    """Sample metric LIKE patterns, or 'step_time' for the steps table."""


PANELS = (
    Panel("step time", "s", 1.0, ("step_time",)),
    Panel("GPU memory used", "GiB", 2**30, ("gpu%.mem_used(B)",)),
    Panel("PCIe (tx, rx)", "GB/s", 1e9, ("gpu%.pcie_tx(B/s)", "gpu%.pcie_rx(B/s)")),
    Panel("NVMe device (read, write)", "GB/s", 1e9, ("disk.read(B/s)", "disk.write(B/s)")),
    Panel("host RSS, process tree", "GiB", 2**30, ("host.rss_tree(B)",)),
    Panel("GPU utilization", "%", 1.0, ("gpu%.util(%)",)),
)


def _series(store: RunStore, strategy_id: int, panel: Panel) -> list[list[tuple[float, float]]]:
    if panel.metrics == ("step_time",):
        steps = store.steps(strategy_id)
        return [[(r.step, r.step_time_s) for r in steps]] if steps else []
    out = []
    for pattern in panel.metrics:
        rows = [(t, v / panel.scale) for t, _, v in store.samples(strategy_id, pattern) if v is not None]
        if rows:
            t0 = rows[0][0]
            out.append([(t - t0, v) for t, v in rows])
    return out


def svg_chart(lines: list[list[tuple[float, float]]], y_max: float, x_label: str, unit: str) -> str:
    if not lines:
        return (
            f'<svg width="{WIDTH}" height="{HEIGHT}"><text x="{WIDTH // 2}" y="{HEIGHT // 2}" '
            'text-anchor="middle" fill="#888">no data</text></svg>'
        )
    x_max = max(x for line in lines for x, _ in line) or 1.0
    y_max = y_max or 1.0
    sx = lambda x: PAD + (WIDTH - PAD - 8) * x / x_max  # noqa: E731 - local scale
    sy = lambda y: HEIGHT - PAD + 12 - (HEIGHT - PAD - 4) * y / y_max  # noqa: E731
    parts = [
        f'<svg width="{WIDTH}" height="{HEIGHT}" font-size="10" font-family="sans-serif">',
        f'<line x1="{PAD}" y1="{sy(0)}" x2="{WIDTH - 8}" y2="{sy(0)}" stroke="#999"/>',
        f'<line x1="{PAD}" y1="{sy(0)}" x2="{PAD}" y2="{sy(y_max)}" stroke="#999"/>',
        f'<text x="2" y="{sy(y_max) + 4}">{y_max:.3g}</text><text x="2" y="{sy(0)}">0</text>',
        f'<text x="{WIDTH - 8}" y="{HEIGHT - 4}" text-anchor="end">{x_label} (max {x_max:.3g}) · {unit}</text>',
    ]
    for color, line in zip(COLORS, lines):
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/>')
    parts.append("</svg>")
    return "".join(parts)


def loss_chart(store: RunStore, strategies: list) -> str:
    """Every strategy's loss per step on one chart, with a legend: an inexact strategy (ZenFlow) against
    the exact ones at every step."""
    lines = {row["name"]: [(r.step, r.loss) for r in store.steps(row["id"])] for row in strategies}
    lines = {name: line for name, line in lines.items() if line}
    values = [y for line in lines.values() for _, y in line]
    if not values:
        return svg_chart([], 0.0, "step", "loss")
    low = min(values)
    shifted = [[(x, y - low) for x, y in line] for line in lines.values()]
    chart = svg_chart(shifted, (max(values) - low) * 1.05, "step", f"loss - {low:.4g}")
    legend = "".join(
        f'<span style="color:{color}">&#9644; {html.escape(name)}</span> ' for color, name in zip(COLORS, lines)
    )
    return f"<figure>{chart}<figcaption>{legend}</figcaption></figure>"


def _summary_rows(summaries: list[StrategySummary]) -> str:
    def cell(v):
        return f"<td>{html.escape(str(v))}</td>"

    rows = []
    for s in summaries:
        ckpt = {True: "verified", False: "FAILED", None: "-"}[s.checkpoint_verified]
        status = s.status.label + (f": {s.reason}" if s.reason and s.status is not Status.DONE else "")
        rows.append(
            "<tr>"
            + "".join(
                cell(v)
                for v in (
                    s.name,
                    s.engine,
                    status,
                    fmt_or_dash(s.median_step_time_s, "{:.3f}"),
                    fmt_or_dash(s.p90_step_time_s, "{:.3f}"),
                    fmt_or_dash(s.max_step_time_s, "{:.2f}"),
                    fmt_or_dash(s.stalls, "{}"),
                    fmt_or_dash(s.tokens_per_s, "{:,.0f}"),
                    fmt_or_dash(s.practicality, "{:.0%}"),
                    fmt_or_dash(s.mfu_percent, "{:.1f}%"),
                    fmt_or_dash(s.last_loss_deviation, "{:+.2%}") + ("" if s.exact in (True, None) else " (inexact)"),
                    human_bytes(s.peak_allocated_bytes),
                    human_bytes(s.host_rss_peak_bytes),
                    human_bytes(s.disk_read_bytes_per_step),
                    human_bytes(s.disk_write_bytes_per_step),
                    "-" if s.gpu_idle_share is None else f"{100 * s.gpu_idle_share:.0f}%",
                    ckpt,
                )
            )
            + "</tr>"
        )
    return "\n".join(rows)


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    store = RunStore(run_dir)
    run = store.run()
    strategies = store.strategies(run["id"])
    summaries = summarize(store)
    sections = []
    for panel in PANELS:
        per_strategy = {row["name"]: _series(store, row["id"], panel) for row in strategies}
        values = [y for lines in per_strategy.values() for line in lines for _, y in line]
        y_max = max(values) * 1.05 if values else 0.0
        x_label = "step" if panel.metrics == ("step_time",) else "seconds"
        charts = "".join(
            f"<figure><figcaption>{html.escape(name)}</figcaption>"
            f"{svg_chart(lines, y_max, x_label, panel.unit)}</figure>"
            for name, lines in per_strategy.items()
        )
        sections.append(f"<h2>{html.escape(panel.title)}</h2><div class='row'>{charts}</div>")
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>offloadlab report: {html.escape(run['name'])}</title>
<style>body{{font-family:sans-serif;margin:24px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
td:first-child,td:nth-child(2),td:nth-child(3){{text-align:left}}.row{{display:flex;flex-wrap:wrap;gap:12px}}
figure{{margin:0}} figcaption{{font-size:12px;font-weight:bold}}</style></head><body>
<h1>offloadlab report: {html.escape(run['name'])}</h1><p>run directory {html.escape(str(run_dir))},
status {html.escape(store.run_status())}.
Step figures leave out the first step; tokens/s is tokens over the time of all the other steps;
practicality is tokens/s over the fastest strategy's here that offloads nothing;
the first line of two-line panels is tx/read, the second rx/write.</p>
<table><tr><th>strategy</th><th>engine</th><th>status</th><th>step p50 (s)</th><th>p90</th><th>max</th>
<th>stalls (&gt; 3x p50)</th><th>tokens/s</th><th>practicality</th><th>MFU</th><th>last loss vs exact</th>
<th>GPU peak alloc</th>
<th>host RSS peak</th><th>NVMe read/step</th><th>NVMe write/step</th><th>GPU idle</th><th>checkpoint</th></tr>
{_summary_rows(summaries)}</table>
<h2>loss per step</h2>{loss_chart(store, strategies)}
{''.join(sections)}
</body></html>"""
    out = out or run_dir / "report.html"
    out.write_text(page)
    return out
