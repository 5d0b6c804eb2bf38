"""The screens (live run, its GPUs and ranks, tune sweep, runs browser) and the prompt used to start a job.

Each screen polls the run store from a worker thread and hands the result back to the UI thread; the
screens never touch an engine or a training process, only the stores they write.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Header, Input, Label, Static

from offloadlab.results.status import Status

from . import processes
from .ranks import RanksReader, RanksView
from .reader import WINDOWS_S, ReaderError, RunReader, RunView, TuneView, find_runs, latest, read_tune, when
from .widgets import (
    CompareTable,
    GpuTable,
    RankTable,
    RunHeader,
    StrategyPanel,
    TuneHeatmap,
    show_content,
    top_points_table,
)


class PollingScreen(Screen):
    """A screen that re-reads its data every `app.poll_s` seconds, off the UI thread."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._drawing = asyncio.Lock()
        self._reading = threading.Lock()
        self.closing = threading.Event()
        """Set when the screen goes (the app quits): its read in flight stops at its next SQL step."""

    def on_mount(self) -> None:
        self.set_interval(self.app.poll_s, self._poll)
        self.refresh_data()

    def on_unmount(self) -> None:
        self.closing.set()

    def on_screen_resume(self) -> None:
        self.refresh_data()

    def _poll(self) -> None:
        # Screens of other modes stay mounted: only the one shown reads the store (and it catches up
        # on resume), so a hidden screen costs nothing on a long run's store.
        if self.is_current:
            self.refresh_data()

    def refresh_data(self) -> None:
        self._load()

    @work(thread=True, group="read")
    def _load(self) -> None:
        # One read at a time: a thread cannot be cancelled, so on a slow store every poll used to start
        # another full read beside the last (five at once on a 3-hour store), all racing for the GIL and,
        # now, for the reader's cache. A poll that finds a read in flight leaves it to bring the news.
        if not self._reading.acquire(blocking=False):
            return
        try:
            result = self.read()
        except ReaderError as err:
            result = err
        finally:
            self._reading.release()
        if not self.closing.is_set():  # a read stopped by the app's end has nothing to show, nor an app
            self.app.call_from_thread(self._show, result)

    async def _show(self, result) -> None:
        # A poll can arrive while the previous one still mounts widgets: draw one at a time.
        async with self._drawing:
            try:
                await self._draw_result(result)
            except NoMatches:
                # A read that lands while the app closes finds the screen's widgets gone (seen in CI):
                # there is nothing left to draw on.
                if self.is_attached and self.app.is_running:
                    raise

    async def _draw_result(self, result) -> None:
        if result is None:
            self.say(self.nothing_yet())
        elif isinstance(result, ReaderError):
            self.say(str(result))
        else:
            self.say(None)
            await self.show(result)

    def read(self):
        """The screen's data, None when there is none yet; raises ReaderError for a store it cannot read."""
        raise NotImplementedError

    def nothing_yet(self) -> str:
        raise NotImplementedError

    async def show(self, result) -> None:
        raise NotImplementedError

    def say(self, message: str | None) -> None:
        box = self.query_one("#message", Static)
        show_content(box, message or "")
        box.display = bool(message)


class DashboardScreen(PollingScreen):
    """The run being followed: a panel per strategy and the comparison table."""

    BINDINGS = [("w", "window", "Window")]
    _reader: RunReader | None = None
    window_s = WINDOWS_S[0]
    shown: RunView | None = None
    """The run as last drawn."""

    def action_window(self) -> None:
        """The next window of the sampled series (10 min, 1 h, 6 h), read afresh."""
        self.window_s = WINDOWS_S[(WINDOWS_S.index(self.window_s) + 1) % len(WINDOWS_S)]
        if self._reader is not None:
            self._reader.window_s = self.window_s
        self.refresh_data()

    def compose(self) -> ComposeResult:
        yield Header()
        yield RunHeader(id="run-header")
        yield Static(id="message")
        yield VerticalScroll(id="panels")
        yield Static(id="collapsed")
        yield CompareTable(id="compare")
        yield Footer()

    def read(self) -> RunView | None:
        target = self.app.pinned_run or latest(self.app.root, "run")
        if target is None:
            return None
        first_read = self.app.take_first_read(target)
        if first_read is not None:
            # The read begun with the app: its reader stops with this screen from now on.
            self._reader, self.closing = first_read.reader, first_read.reader.stop
            return first_read.result()
        if self._reader is None or self._reader.run_dir != target:
            if self._reader is not None:
                self._reader.close()
            # Another run: its cache starts afresh.
            self._reader = RunReader(target, self.window_s, self.closing, figures_first=True)
        return self._reader.read()

    def nothing_yet(self) -> str:
        return f"no runs under {self.app.root} yet: start one with `offloadlab run SPEC` or press r, then s"

    async def show(self, result: RunView) -> None:
        # The table first: on the first read, mounting the panels (a few hundred widgets to style) took
        # longer than the read, and the table already holds every strategy's figures.
        self.shown = result
        self.query_one(RunHeader).show(result)
        if self.query_one(CompareTable).show(result):
            # A row that changed is drawn on a repaint of the whole screen: the table's own repaint left a
            # finished strategy reading "running" in a live run (seen in tmux, not in the tests). The table
            # changes when a strategy starts or ends, not every poll.
            self.refresh()
        await self._show_panels(result)
        if result.samples_pending:
            # The sampled series, once the panels are mounted: read beside the mounting, the read's
            # thread took half of the GIL from it, and a key pressed then (q) waited for both (0.27-0.33 s
            # on a 24-hour store of 8 GPUs, 0.18-0.20 s now).
            self.refresh_data()

    async def _show_panels(self, view: RunView) -> None:
        box = self.query_one("#panels", VerticalScroll)
        panels = self._panels()
        # The running strategy first, at the top: at 80x24 one panel fits, and it was below the finished ones.
        shown = sorted(view.strategies, key=lambda s: s.summary.status is not Status.RUNNING)
        names = [s.name for s in shown]
        if sorted(p.strategy_name for p in panels) != sorted(names):
            self.refresh()  # the table is drawn while the panels mount (a repaint of the whole screen: not each poll)
            await box.remove_children()
            panels = [StrategyPanel(s.name, classes="strategy") for s in shown]
            await box.mount_all(panels)
            box.scroll_home(animate=False)
        elif [p.strategy_name for p in panels] != names:
            # Another strategy runs now: its panel moves to the top, the panels are kept (a remount left
            # them empty for a frame).
            by_name = {p.strategy_name: p for p in panels}
            panels = [by_name[name] for name in names]
            for index, panel in enumerate(panels):
                box.move_child(panel, before=index)
            box.scroll_home(animate=False)
        for panel, strategy in zip(panels, shown):
            panel.view = strategy
        self._collapse()

    def _panels(self) -> list[StrategyPanel]:
        # The panels are #panels' children: a query matched CSS selectors over every widget of the screen,
        # a few thousand on a run of four strategies, and took most of a poll's drawing.
        return list(self.query_one("#panels", VerticalScroll).children)

    def _collapse(self) -> None:
        """Finished and pending strategies fold into their table row: the running strategy's panel shows,
        and the panel of the row the table's cursor is on while the table has focus (or, once nothing
        runs, always), so at 80x24 the running one is not pushed off the screen."""
        table = self.query_one(CompareTable)
        panels = self._panels()
        running = {p.strategy_name for p in panels if p.view and p.view.summary.status is Status.RUNNING}
        opened = table.cursor_name() if table.has_focus or not running else None
        for panel in panels:
            panel.display = panel.strategy_name in running or panel.strategy_name == opened
        folded = sum(not p.display for p in panels)
        hint = self.query_one("#collapsed", Static)
        show_content(
            hint, f"{folded} more in the table: tab to it, then ↑↓ to open a strategy's panel" if folded else ""
        )
        hint.display = bool(folded)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._collapse()
        opened = self.query_one(CompareTable).cursor_name() if event.data_table.has_focus else None
        panel = next((p for p in self._panels() if p.strategy_name == opened and p.display), None)
        if panel is not None:
            self._scroll_to(panel)

    def _scroll_to(self, panel: StrategyPanel, tries: int = 20) -> None:
        """Scrolls the panels to this one (below the running one's it was off-screen at 80x24), once it is
        laid out: just shown, it has no place yet, and a scroll to it then went nowhere (for several
        refreshes at times, so it is looked at again every 50 ms, for a second at most)."""
        if not panel.region.area and tries:
            self.set_timer(0.05, lambda: self._scroll_to(panel, tries - 1))
        else:
            self.query_one("#panels").scroll_to_widget(panel, animate=False, top=True)

    def on_descendant_focus(self) -> None:
        self._collapse()

    def on_descendant_blur(self) -> None:
        self._collapse()


class RanksScreen(PollingScreen):
    """The followed run's running strategy as nvitop shows a machine: a row per GPU (utilization and
    memory bars, PCIe, power) and a row per rank as a process (PID, RSS, CPU)."""

    _reader: RanksReader | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="ranks-title")
        yield Static(id="message")
        yield Label("GPUs (each one's newest sample)", id="gpus-title", classes="section")
        yield GpuTable(id="gpus")
        yield Label("ranks (processes; CPU: 100% a core, of the cores each is bound to)", classes="section")
        yield RankTable(id="ranks")
        yield Footer()

    def read(self) -> RanksView | None:
        target = self.app.pinned_run or latest(self.app.root, "run")
        if target is None:
            return None
        if self._reader is None or self._reader.run_dir != target:
            self._reader = RanksReader(target, self.closing)
        return self._reader.read()

    def nothing_yet(self) -> str:
        return f"no strategy has started under {self.app.root} yet: its GPUs and ranks show here once one does"

    async def show(self, result: RanksView) -> None:
        self.query_one("#ranks-title", Static).update(
            Text.assemble((result.strategy, "bold"), f" ({result.status.label})  {result.run_dir}")
        )
        self.query_one(GpuTable).show(result)
        # Without GPU samples the note says why, in place of the table and its title.
        self.query_one(GpuTable).display = self.query_one("#gpus-title").display = bool(result.gpus)
        if not result.gpus:
            self.say(result.gpu_note or "no GPU samples yet")
        self.query_one(RankTable).show(result)


class TuneScreen(PollingScreen):
    """The aio sweep as a heatmap per thread count, with the leading points."""

    BINDINGS = [
        ("left_square_bracket", "threads(-1)", "threads -"),
        ("right_square_bracket", "threads(1)", "threads +"),
    ]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.threads: int | None = None
        self.view: TuneView | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="tune-title")
        yield Static(id="message")
        yield Static(id="threads")
        yield TuneHeatmap(id="heatmap")
        yield DataTable(id="top-points", cursor_type="none")
        yield Footer()

    def read(self) -> TuneView | None:
        target = self.app.pinned_tune or latest(self.app.root, "tune")
        return None if target is None else read_tune(target)

    def nothing_yet(self) -> str:
        return f"no tune results under {self.app.root} yet: run `offloadlab tune --nvme PATH` or press r, then a"

    async def show(self, result: TuneView) -> None:
        self.view = result
        self._draw()

    def _thread_counts(self) -> list[int]:
        return sorted({p.aio.intra_op_parallelism for p in self.view.points}) if self.view else []

    def _draw(self) -> None:
        view, counts = self.view, self._thread_counts()
        if not counts:
            self.query_one("#tune-title", Static).update(
                f"tune {view.run_dir.name}: {view.status}, no points measured yet"
            )
            return
        best = next((p for p in view.points if p.is_best), view.points[0])
        if self.threads not in counts:
            self.threads = best.aio.intra_op_parallelism
        title = Text.assemble(
            (f"tune {view.run_dir.name}", "bold"),
            f"  {view.status}  {len(view.points)} points  best ",
            (f"{best.score_gbps:.2f} GB/s", "bold green"),
            f" (read {best.read_gbps:.2f}, write {best.write_gbps:.2f})",
        )
        self.query_one("#tune-title", Static).update(title)
        chips = Text("threads: ")
        for t in counts:
            chips.append(f" {t} ", style="reverse bold" if t == self.threads else "")
        chips.append("   score GB/s by block size x queue depth; * best, d DeepSpeed default", style="dim")
        self.query_one("#threads", Static).update(chips)
        self.query_one(TuneHeatmap).show(view, self.threads)
        top_points_table(self.query_one("#top-points", DataTable), view)

    def action_threads(self, step: int) -> None:
        counts = self._thread_counts()
        if counts:
            index = counts.index(self.threads) if self.threads in counts else 0
            self.threads = counts[(index + step) % len(counts)]
            self._draw()


class PromptScreen(ModalScreen[str | None]):
    """Ask for one path; Enter answers, Escape cancels."""

    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, prompt: str, placeholder: str):
        super().__init__()
        self.prompt, self.placeholder = prompt, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Label(self.prompt)
            yield Input(placeholder=self.placeholder)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class RunsScreen(PollingScreen):
    """Past and running run directories under the root; open one, or start and stop jobs."""

    BINDINGS = [
        ("enter", "open", "Open"),
        ("s", "start_run", "Start run"),
        ("a", "start_tune", "Start tune"),
        ("x", "stop", "Stop job"),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="message")
        yield DataTable(id="runs", cursor_type="row")
        yield Static(id="jobs")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#runs", DataTable).add_columns("run", "kind", "status", "strategies", "created")
        super().on_mount()

    def read(self):
        return find_runs(self.app.root)

    def nothing_yet(self) -> str:
        return f"no run directories under {self.app.root} yet"

    async def show(self, entries) -> None:
        table = self.query_one("#runs", DataTable)
        selected = table.cursor_row
        table.clear()
        for e in entries:
            strategies = f"{e.strategies_done}/{e.strategies_total}" if e.kind == "run" else "-"
            table.add_row(
                e.path.name or str(e.path), e.kind, e.status, strategies, when(e.created_at), key=str(e.path)
            )
        if entries:
            table.move_cursor(row=min(selected, len(entries) - 1))
        else:
            self.say(self.nothing_yet())
        jobs = self.app.jobs
        self.query_one("#jobs", Static).update(
            "jobs started here:\n" + "\n".join(j.describe() for j in jobs) if jobs else "no jobs started from this TUI"
        )

    def action_open(self) -> None:
        table = self.query_one("#runs", DataTable)
        if table.row_count:
            key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
            self.app.open_dir(Path(key))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.open_dir(Path(event.row_key.value))

    def action_start_run(self) -> None:
        def start(spec: str | None) -> None:
            if spec:
                self._start(lambda: processes.start_run(Path(spec), self.app.root))

        self.app.push_screen(
            PromptScreen("Spec to run (TOML; `offloadlab init configs` writes examples):", "configs/tiny_cpu.toml"),
            start,
        )

    def action_start_tune(self) -> None:
        def start(nvme: str | None) -> None:
            if nvme:
                self._start(lambda: processes.start_tune(Path(nvme), self.app.root))

        self.app.push_screen(PromptScreen("Folder on the drive to tune (--nvme, quick sweep):", "/mnt/nvme0"), start)

    def _start(self, launch) -> None:
        try:
            job = launch()
        except OSError as err:
            self.notify(str(err), severity="error")
            return
        self.app.jobs.append(job)
        self.notify(f"started {job.describe()}")
        self.refresh_data()

    def action_stop(self) -> None:
        running = [j for j in self.app.jobs if j.running]
        if not running:
            self.notify("no job started from this TUI is running", severity="warning")
            return
        running[-1].stop()
        self.notify(f"stopping {running[-1].describe()}: it removes what it created")
        self.refresh_data()
