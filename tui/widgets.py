"""Small widgets: one metric's sparkline, one strategy's panel, the comparison table, the tune heatmap, the
GPU and rank tables."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Grid, Vertical
from textual.reactive import reactive
from textual.widgets import DataTable, Label, Sparkline, Static

from offloadlab.results.status import Status, ran_to_its_end
from offloadlab.results.steps import PHASES
from offloadlab.results.store import TunePoint
from offloadlab.results.summary import StrategySummary
from offloadlab.results.tables import (
    against_plan,
    ago,
    bound_by,
    duration,
    fmt_or_dash,
    human_bytes,
    loss_deviation,
    nvme_against_tuned,
    optimizer_rate,
    pcie_against_link,
    share,
    stalls,
)

from .ranks import RanksView
from .reader import WINDOW_STEPS, RunView, Series, StrategyView, TuneView


def _rate(bytes_per_s: float) -> str:
    """GB/s, as compare and the report give rates."""
    return f"{bytes_per_s / 1e9:.2f} GB/s"


def step_seconds(seconds: float) -> str:
    """A step's time to a millisecond under 10 s, a tenth above: "19.000 .. 21.000 s" was cut at 80 columns."""
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def hours_minutes(seconds: float) -> str:
    """h:mm, rounded up: an ETA of 20 s is "0:01", not "0:00"."""
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60}:{minutes % 60:02d}"


def status_text(summary: StrategySummary, with_reason: bool = True) -> Text:
    status = summary.status.label
    if with_reason and summary.reason and summary.status in (Status.DOES_NOT_FIT, Status.FAILED):
        status += f": {summary.reason}"
    return Text(status, style=summary.status.style)


def show_content(widget: Static, content: str | Text) -> None:
    """Static.update lays the screen out again whether or not its content changed: each poll of a long
    run re-laid out the dashboard for every line it rewrote unchanged. Only a change is shown, and the
    screen is laid out again only where the change can give the widget another height."""
    if widget.content != content:
        widget.update(content, layout=_may_change_rows(widget, content))


def _may_change_rows(widget: Static, content: str | Text) -> bool:
    """Whether the widget may take another number of rows: another count of lines, or a line that may wrap
    (as wide as the widget). A running strategy's step count and ETA change every poll, and each change
    laid the whole dashboard out again. Markup is counted as text: wider, never narrower."""
    width = widget.content_region.width
    auto_width = widget.styles.width is not None and widget.styles.width.is_auto
    if not width or auto_width:
        return True
    old, new = str(widget.content), str(content)
    if old.count("\n") != new.count("\n"):
        return True
    return any(cell_len(line) >= width for line in (old + "\n" + new).splitlines())


class MetricSpark(Vertical):
    """A titled sparkline of a window of values, with the figure (latest, or steady once finished) and the
    window's min and max, or a note saying why there is no data."""

    def __init__(self, title: str, **kwargs):
        super().__init__(**kwargs)
        # Made here, not in compose, so a value can be shown before the widget is mounted. Each bar is the
        # mean of its bin: a max lets one spike (the warm-up step, a stall) fill every bar of a long run.
        self.spark = Sparkline([], summary_function=statistics.fmean)
        self.value = Label("-", classes="metric-value")
        self.range = Label("", classes="metric-range")
        self.metric_name = title
        self._drawn = (float("-inf"), None)
        """(when, over which window) the bars were last drawn."""

    def compose(self) -> ComposeResult:
        yield Label(self.metric_name, classes="metric-title")
        yield self.spark
        yield self.value
        yield self.range

    def show(
        self,
        series: Series,
        fmt: Callable[[float], str],
        finished: bool,
        absent: str = "no data yet",
        window_s: float | None = None,
    ) -> None:
        """window_s: a sampled series' window, whose bars are redrawn once a bar's time has passed (a bar of
        a 10-minute window is about 20 s of samples: redrawing them every poll was most of a poll's drawing)."""
        bar_s = window_s / self.spark.size.width if window_s and self.spark.size.width else 0.0
        now = time.monotonic()
        drawn_at, drawn_window_s = self._drawn
        if finished or not self.spark.data or window_s != drawn_window_s or now - drawn_at >= bar_s:
            # One value (a 1-h window of a 2-s strategy: one bin) is drawn flat, as a constant series is:
            # Textual fills every bar for it, which read as a peak over "0.00 GB/s".
            self.spark.data = series.values * 2 if len(series.values) == 1 else series.values
            self._drawn = (now, window_s)
        if not series.values or series.figure is None:
            show_content(self.value, absent)
            show_content(self.range, "")
            return
        # What the figure is: the latest value while the strategy runs, the mean of its steady steps after.
        show_content(self.value, f"{fmt(series.figure)} {'mean' if finished else 'now'}")
        low, high = fmt(min(series.values)), fmt(max(series.values))
        if " " in low and low.rsplit(" ", 1)[1] == high.rsplit(" ", 1)[-1]:
            low = low.rsplit(" ", 1)[0]  # the unit once: "0.00 .. 0.01 GB/s" fits a quarter of 80 columns
        show_content(self.range, f"{low} .. {high}")


PHASE_STYLES = {"forward": "blue", "backward": "magenta", "optimizer": "yellow", "other": "bright_black"}
PHASE_BAR_WIDTH = 20
PHASE_ABBREVIATIONS = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}


def phase_bar(s: StrategySummary) -> Text:
    """Where a steady step goes, as one stacked bar: forward, backward, optimizer and the rest, each with
    the part of it spent waiting for NVMe swaps shaded ░, then the verdict ("bound by optimizer 84%") and
    the step's mean seconds in each; one line at 80 columns."""
    if not s.phase_seconds or s.bound_by is None:
        return Text("")
    total = sum(s.phase_seconds.values())
    bar = Text()
    for name, seconds in s.phase_seconds.items():
        waiting = s.nvme_waiting_in(name)
        bar.append("█" * round(PHASE_BAR_WIDTH * (seconds - waiting) / total), style=PHASE_STYLES[name])
        bar.append("░" * round(PHASE_BAR_WIDTH * waiting / total), style=PHASE_STYLES[name])
    name, share = s.bound_by
    bar.append(f" bound by {name} {share:.0%} ", style="bold")
    for phase in PHASES:  # "other" is the grey rest of the bar
        bar.append(f" {PHASE_ABBREVIATIONS[phase]} {s.phase_seconds[phase]:.2g}", style=PHASE_STYLES[phase])
    return bar.append(" s")


def capacity_line(s: StrategySummary) -> Text:
    """Use against capacity, as nvitop shows memory: the GPU's reserve against its memory (or the budget the
    run was held to), the process tree's RSS against the host's RAM, NVMe against the rates the tune
    measured and the step's wait for it, PCIe against the link and the step against the plan's (`run --plan`)."""
    parts = []
    if s.peak_reserved_bytes and s.gpu_memory_bytes:
        of = human_bytes(s.gpu_memory_bytes) + (" budget" if s.gpu_budget_bytes else "")
        used = share(s.peak_reserved_bytes, s.gpu_memory_bytes)
        parts.append(f"GPU {human_bytes(s.peak_reserved_bytes)} {used} of {of}")
    if s.host_rss_peak_bytes and s.host_memory_bytes:
        used = share(s.host_rss_peak_bytes, s.host_memory_bytes)
        parts.append(f"RSS {human_bytes(s.host_rss_peak_bytes)} {used} of {human_bytes(s.host_memory_bytes)} RAM")
    rates, shares = nvme_against_tuned(s)
    if rates != "-":
        parts.append(f"NVMe r/w {rates} GB/s" + ("" if shares == "-" else f", {shares} of tuned"))
    if s.nvme_wait_share is not None:
        parts.append(f"NVMe wait ░ {s.nvme_wait_share:.0%} of the step")
    rates, shares = pcie_against_link(s)
    if rates != "-":
        parts.append(f"PCIe h2d/d2h {rates} GB/s" + ("" if shares == "-" else f", {shares} of link"))
    planned, ratio = against_plan(s)
    if ratio != "-":
        parts.append(f"step {ratio} the plan's {planned} s")
    return Text(" · ".join(parts), style="dim")


class StrategyPanel(Vertical):
    """One strategy: status and progress, then its series as sparklines."""

    # Redrawn only when the view differs: an unchanged panel repainted every poll cost most of a poll's CPU.
    view: reactive[StrategyView | None] = reactive(None, init=False)

    METRICS = (
        ("step", "step time"),
        ("tps", "tokens/s"),
        ("gpu", "GPU memory"),
        ("tx", "PCIe to host, all GPUs"),
        ("rx", "PCIe to GPU, all GPUs"),
        ("read", "disk read"),
        ("write", "disk write"),
        ("cpu", "host CPU"),
    )

    def __init__(self, strategy_name: str, **kwargs):
        super().__init__(**kwargs)
        self.strategy_name = strategy_name
        self.heading = Static(classes="panel-title")
        self.phases = Static(classes="phases")
        self.capacity = Static(classes="capacity")
        self.windows = Static(classes="windows")
        self.metrics = {key: MetricSpark(title, id=f"m-{key}") for key, title in self.METRICS}

    def compose(self) -> ComposeResult:
        yield self.heading
        yield self.phases
        yield self.capacity
        yield self.windows
        with Grid(classes="metrics"):
            yield from self.metrics.values()

    def watch_view(self, view: StrategyView) -> None:
        s = view.summary
        progress = f"step {s.steps_done} of {s.steps_planned}"
        if view.stage:
            progress += f", {view.stage}"
        elif view.eta_s is not None:
            progress += f", ETA {hours_minutes(view.eta_s)}"
        title = Text.assemble((s.name, "bold"), f"  {s.engine}  ", status_text(s), f"  {progress}")
        show_content(self.heading, title)
        self.set_class(s.status is Status.RUNNING, "-running")
        self.set_class(s.status in (Status.DOES_NOT_FIT, Status.FAILED), "-failed")
        show_content(self.phases, phase_bar(s))
        self.phases.display = s.phase_seconds is not None
        capacity = capacity_line(s)
        show_content(self.capacity, capacity)
        self.capacity.display = bool(capacity.plain)
        # No GPU: its three series are left out rather than drawn flat.
        for key in ("gpu", "tx", "rx"):
            self.metrics[key].display = not view.gpu_absent

        done = s.status.finished
        sampled = f"the last {duration(view.window_s)}"
        if 0 < view.stepped_s < view.window_s:  # a 6-hour window over 10 minutes of a run spreads those 10
            sampled = f"{duration(view.stepped_s)} in a {duration(view.window_s)} window"
        show_content(self.windows, Text(f"step series: the last {WINDOW_STEPS} steps · sampled: {sampled} (w)", "dim"))
        self.metrics["step"].show(view.step_time_s, step_seconds, done)
        self.metrics["tps"].show(view.tokens_per_s, lambda v: f"{v:,.0f}", done)
        self.metrics["gpu"].show(view.gpu_allocated_bytes, human_bytes, done)
        window_s = view.window_s
        self.metrics["tx"].show(view.pcie_tx_bytes_per_s, _rate, done, window_s=window_s)
        self.metrics["rx"].show(view.pcie_rx_bytes_per_s, _rate, done, window_s=window_s)
        no_disk = "no block device" if any("disk fields absent" in n for n in view.telemetry_notes) else "no data yet"
        self.metrics["read"].show(view.disk_read_bytes_per_s, _rate, done, no_disk, window_s)
        self.metrics["write"].show(view.disk_write_bytes_per_s, _rate, done, no_disk, window_s)
        self.metrics["cpu"].show(view.host_cpu_percent, lambda v: f"{v:.0f}%", done, window_s=window_s)


class RunHeader(Static):
    """The run's name and state, and what runs now."""

    def show(self, view: RunView) -> None:
        done = sum(ran_to_its_end(s.summary.status, s.summary.reason) for s in view.strategies)
        folder = "" if view.run_dir.name == view.name else f"  {view.run_dir.name}"
        text = Text.assemble(
            (view.name, "bold"),
            f"{folder}  ",
            (view.status, "cyan" if view.status is Status.RUNNING else ""),
            f"  {done}/{len(view.strategies)} strategies finished",
        )
        if view.status is not Status.DONE and view.last_written:
            text.append(f"  last update {ago(self.app.clock() - view.last_written)}", style="dim")
        current = view.current
        if current:
            s = current.summary
            eta = f", ETA {hours_minutes(current.eta_s)}" if current.eta_s is not None else ""
            stage = f", {current.stage}" if current.stage else eta
            text.append(f"\nnow: {s.name} step {s.steps_done} of {s.steps_planned}{stage}", style="cyan")
            if view.eta is not None:
                seconds, unknown = view.eta
                more = f" + {unknown} strateg{'ies' if unknown > 1 else 'y'} without a plan" if unknown else ""
                text.append(f"; run ETA {hours_minutes(seconds)}{more}", style="cyan")
        show_content(self, text)


class CompareTable(DataTable):
    """The strategies side by side; a row fills in when its strategy finishes."""

    COLUMNS = (  # the checkpoint's check after the status: at 120 columns the last ones are scrolled to
        "strategy",
        "status",
        "ckpt",
        "p50 / p90 s",
        "max s",
        "stalls",
        "tokens/s",
        "practical",
        "MFU",
        "Δ loss",
        "GPU peak",
        "host RSS",
        "NVMe r/w per step",
        "GPU idle",
        "NVMe wait",
        "comm/step",
        "bound by",
        "opt threads, M params/s",
    )

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*((label, label) for label in self.COLUMNS))  # keyed by their labels

    def cursor_name(self) -> str | None:
        """The strategy of the row the cursor is on."""
        if not self.row_count:
            return None
        return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)

    def show(self, view: RunView) -> bool:
        """Show the view's rows; whether a strategy started, ended or came (the running row's figures
        change every poll, and are not counted)."""
        rows = {sv.name: self._cells(sv.summary) for sv in view.strategies}
        if [str(k.value) for k in self.rows] != list(rows):
            self.clear()
            for name, cells in rows.items():
                self.add_row(*cells, key=name)
            return True
        # The same strategies: cells change in place, so a scrolled table stays where the user put it (a
        # clear and refill every poll snapped it back to the left).
        status_changed = False
        for name, cells in rows.items():
            for column, cell in zip(self.columns, cells):
                if self.get_cell(name, column) != cell:  # an unchanged cell is not repainted
                    # Widths follow the data: set at the first paint, when every cell was "-", they cut
                    # "0.243 / 0.6" for good.
                    self.update_cell(name, column, cell, update_width=True)
                    status_changed |= column == "status"
        return status_changed

    def _measured(self) -> tuple:
        return [column.content_width for column in self.columns.values()], self.virtual_size

    async def _on_idle(self, event: events.Idle) -> None:
        # DataTable measures new rows and changed cells once idle and widens their columns there. The lines
        # it drew before that are cached under keys without the widths, so they stayed as drawn: a finished
        # strategy still read "running", or a header narrower than its rows, until a key was pressed. Only
        # a change of widths repaints the screen: a cell that changed within its width bumped the cache's
        # key itself, and a repaint of the whole screen on every poll of a live run took most of its CPU.
        before = self._measured()
        await super()._on_idle(event)
        event.prevent_default()  # DataTable's own handler, which Textual calls next, has just run
        if self._measured() != before:
            self._clear_caches()
            self.screen.refresh()  # as on a change (DashboardScreen.show): the table's own repaint fell behind

    @staticmethod
    def _cells(s: StrategySummary) -> list:
        finished = s.status.finished
        fmt = lambda v, f: fmt_or_dash(v if finished else None, f)  # noqa: E731 - a dash until it finishes
        idle = None if s.gpu_idle_share is None else 100 * s.gpu_idle_share
        ckpt = {True: Text("verified", "green"), False: Text("FAILED", "red"), None: Text("-")}[s.checkpoint_verified]
        return [
            # The reason is in the strategy's panel; the table keeps to one short word.
            s.name,
            status_text(s, with_reason=False),
            ckpt,
            "-" if not finished else f"{fmt(s.median_step_time_s, '{:.3f}')} / {fmt(s.p90_step_time_s, '{:.3f}')}",
            fmt(s.max_step_time_s, "{:.2f}"),
            stalls(s) if finished else "-",
            fmt(s.tokens_per_s, "{:,.0f}"),
            fmt(s.practicality, "{:.0%}"),
            fmt(s.mfu_percent, "{:.1f}%"),
            loss_deviation(s) if finished else "-",
            human_bytes(s.peak_allocated_bytes) if finished else "-",
            human_bytes(s.host_rss_peak_bytes) if finished else "-",
            f"{human_bytes(s.disk_read_bytes_per_step)} / {human_bytes(s.disk_write_bytes_per_step)}"
            if finished
            else "-",
            fmt(idle, "{:.0f}%"),
            fmt(s.nvme_wait_share, "{:.0%}"),
            human_bytes(s.comm_bytes_per_step) if finished else "-",
            bound_by(s) if finished else "-",  # live in the panel's phase bar: a change here redrew the table
            f"{fmt_or_dash(s.cpu_threads, '{}')}, {optimizer_rate(s)}" if finished else "-",
        ]


def _size(block_size: int) -> str:
    return f"{block_size >> 20}M" if block_size >= 1 << 20 else f"{block_size >> 10}K"


class TuneHeatmap(DataTable):
    """Score GB/s by block size (rows) x queue depth (columns) for one thread count; best point highlighted."""

    def on_mount(self) -> None:
        self.cursor_type = "none"
        self.zebra_stripes = False

    def show(self, view: TuneView, threads: int) -> None:
        self.clear(columns=True)
        points = [p for p in view.points if p.aio.intra_op_parallelism == threads]
        if not points:
            return
        depths = sorted({p.aio.queue_depth for p in points})
        blocks = sorted({p.aio.block_size for p in points})
        top = max(p.score_gbps for p in view.points)
        low = min(p.score_gbps for p in view.points)
        self.add_columns("block \\ depth", *(str(d) for d in depths))
        best = next((p for p in view.points if p.is_best), None) or view.points[0]
        for block in blocks:
            cells: list[Text | str] = [_size(block)]
            for depth in depths:
                here = [p for p in points if p.aio.block_size == block and p.aio.queue_depth == depth]
                if not here:
                    cells.append("")
                    continue
                # The cell shows the best single_submit/overlap_events variant; it says "d" where DeepSpeed's
                # default is one of them, though a variant of it scores higher.
                cell = max(here, key=lambda p: p.score_gbps)
                default_here = any(p.is_deepspeed_default for p in here)
                cells.append(self._cell(cell, best in here, default_here, low, top))
            self.add_row(*cells)

    @staticmethod
    def _cell(point: TunePoint, is_best: bool, is_default: bool, low: float, top: float) -> Text:
        share = 0.0 if top == low else (point.score_gbps - low) / (top - low)
        shade = int(40 + 140 * share)
        label = f"{point.score_gbps:.2f}" + ("*" if is_best else "") + ("d" if is_default else "")
        style = "bold black on green" if is_best else f"white on rgb(0,{shade // 2},{shade})"
        return Text(f" {label} ", style=style)


def top_points_table(table: DataTable, view: TuneView, count: int = 8) -> None:
    table.clear(columns=True)
    table.add_columns("setting", "read GB/s", "write GB/s", "score", "n", "stage")
    shown = view.points[:count]
    default = next((p for p in view.points if p.is_deepspeed_default), None)
    if default is not None and default not in shown:  # what the tune is measured against stays in view
        shown = shown[: count - 1] + [default]
    for p in shown:
        label = (
            f"bs={_size(p.aio.block_size)} qd={p.aio.queue_depth} t={p.aio.intra_op_parallelism} "
            f"ss={int(p.aio.single_submit)} ov={int(p.aio.overlap_events)}"
        )
        style = "bold green" if p.is_best else ("cyan" if p.is_deepspeed_default else "")
        table.add_row(
            Text(label, style),
            f"{p.read_gbps:.2f}",
            f"{p.write_gbps:.2f}",
            f"{p.score_gbps:.2f}",
            str(p.repeats),
            p.stage,
        )


def usage_bar(used: float | None, capacity: float | None, width: int = 8) -> Text:
    """A bar and its percentage, green to 50%, yellow to 80%, red above (btop's and nvitop's thresholds
    read the same way: red is where a GPU runs out of memory or a core is saturated)."""
    if used is None or not capacity:
        return Text("-")
    fraction = min(max(used / capacity, 0.0), 1.0)
    style = "green" if fraction < 0.5 else "yellow" if fraction < 0.8 else "red"
    filled = round(fraction * width)
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"), f" {fraction:4.0%}")


class GpuTable(DataTable):
    """One row per GPU: its newest sample (the sampler's NVML fields)."""

    COLUMNS = ("GPU", "util", "memory", "used of GPU", "PCIe tx/rx", "power", "temp")

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)

    def show(self, view: RanksView) -> None:
        self.clear()
        for gpu in view.gpus:
            f = gpu.fields
            used = f.get("mem_used(B)")
            self.add_row(
                str(gpu.index),
                usage_bar(f.get("util(%)"), 100.0),
                usage_bar(used, gpu.memory_total_bytes),
                _used_of(used, gpu.memory_total_bytes),
                f"{f.get('pcie_tx(B/s)', 0.0) / 1e9:.2f}/{_rate(f.get('pcie_rx(B/s)', 0.0))}",
                fmt_or_dash(f.get("power(W)"), "{:.0f} W"),
                fmt_or_dash(f.get("temp(C)"), "{:.0f} C"),
            )


def _used_of(used: float | None, total: int | None) -> str:
    """ "30.0/80.0 GiB": both in the unit of the total, so the pair reads at a glance."""
    if used is None or not total:
        return human_bytes(used)
    value, unit = human_bytes(total).split()
    return f"{used * float(value) / total:.1f}/{value} {unit}"


class RankTable(DataTable):
    """One row per rank, as a process: where it runs, its memory and its CPU (100% a core)."""

    COLUMNS = ("rank", "PID", "state", "device", "RSS", "CPU", "cores")

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)

    def show(self, view: RanksView) -> None:
        self.clear()
        for row in view.ranks:
            p = row.process
            cores = len(p.cpu_cores)
            self.add_row(
                str(row.rank),
                str(p.pid),
                Text(row.state, "green" if row.state == "running" else "dim"),
                p.device,
                human_bytes(row.rss_bytes) if row.rss_bytes is not None else "-",
                usage_bar(row.cpu_percent, 100.0 * cores),
                str(cores) if cores else "-",
            )
