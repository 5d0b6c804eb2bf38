"""`offloadlab tui`: the Textual app. It reads run stores and starts jobs as separate processes.

Installed as the `offloadlab_tui` package with an `offloadlab-tui` entry point (`main`), which
`offloadlab tui` calls: no folder in the user's current directory can stand in for it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from textual.app import App
from textual.binding import Binding

from .processes import Job
from .reader import FirstRead, find_runs
from .screens import DashboardScreen, RanksScreen, RunsScreen, TuneScreen

POLL_S = 2.0
"""Seconds between reads of the store, as nvitop's and btop's default: the dashboards of 6- and 24-hour runs
cost 2.1-2.8% of a core read every second (a redraw of the panel for each new step and sample), 1.5-1.8%
every two (bench/long_run_ui.py, a writer adding a step a second)."""


class OffloadlabApp(App):
    CSS_PATH = "offloadlab.tcss"
    TITLE = "offloadlab"
    MODES = {"dashboard": DashboardScreen, "ranks": RanksScreen, "tune": TuneScreen, "runs": RunsScreen}
    # Set at startup, not switched to in on_mount: a key pressed while the app starts must not be undone.
    DEFAULT_MODE = "dashboard"
    BINDINGS = [
        ("d", "switch_mode('dashboard')", "Dashboard"),
        ("g", "switch_mode('ranks')", "GPUs"),
        ("t", "switch_mode('tune')", "Tune"),
        ("r", "switch_mode('runs')", "Runs"),
        ("q", "quit", "Quit"),
        # Textual's own Ctrl-C only says to press q; a monitor's users press it to leave (nvitop, btop quit).
        # A prompt keeps it for copying: the focused widget's binding comes first.
        Binding("ctrl+c", "quit", "Quit", show=False),
        ("question_mark", "help", "Keys"),
    ]

    def __init__(
        self,
        root: Path = Path("runs"),
        run_dir: Path | None = None,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.time,
    ):
        super().__init__()
        self.root, self.poll_s = Path(root), poll_s
        self.clock = clock
        """What "N min ago" counts from (snapshot tests fix it)."""
        # None: follow the run (or tune) under root that is running, else the newest, so one started later
        # is picked up.
        self.pinned_run: Path | None = None
        self.pinned_tune: Path | None = None
        self.jobs: list[Job] = []
        self._start_mode: str | None = None
        self._first_read: FirstRead | None = None
        if run_dir is not None:
            # Pinned before the first screen reads anything: its first frame is this run, no other.
            self._start_mode = self._pin(Path(run_dir))
            if self._start_mode == "dashboard":
                self._first_read = FirstRead(self.pinned_run)

    def on_mount(self) -> None:
        if self._start_mode == "tune":
            self.switch_mode("tune")

    def on_unmount(self) -> None:
        if self._first_read is not None:
            self._first_read.stop()

    def take_first_read(self, run_dir: Path) -> FirstRead | None:
        """The read begun as the app was made, once, for the dashboard's first read of that run."""
        first_read, self._first_read = self._first_read, None
        if first_read is not None and first_read.reader.run_dir != run_dir:
            first_read.stop()
            return None
        return first_read

    def _pin(self, path: Path) -> str:
        entry = next((e for e in find_runs(path) if e.path == path), None)
        if entry is not None and entry.kind == "tune":
            self.pinned_tune = path
            return "tune"
        # An unreadable or missing store still opens: the dashboard says what is wrong with it.
        self.pinned_run = path
        return "dashboard"

    def action_help(self) -> None:
        """Every key of the screen shown and the widget in focus (scrolling included), beside the screen."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def open_dir(self, path: Path) -> None:
        self.switch_mode(self._pin(path))


def make_app(
    root: Path = Path("runs"),
    run_dir: Path | None = None,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.time,
) -> OffloadlabApp:
    """The app over the run stores under `root` (tests pass a folder of their own, and may fix the clock)."""
    return OffloadlabApp(root=root, run_dir=run_dir, poll_s=poll_s, clock=clock)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="offloadlab tui")
    parser.add_argument(
        "run_dir", nargs="?", type=Path, help="A run or tune directory (default: follow the newest under --root)"
    )
    parser.add_argument(
        "--root", type=Path, help="Where run directories live (default: the given run's folder, else ./runs)"
    )
    parser.add_argument(
        "--poll",
        type=poll_seconds,
        default=POLL_S,
        help=f"Seconds between reads of the run store (default {POLL_S:g})",
    )
    args = parser.parse_args(argv)
    app = make_app(root=root_of(args.run_dir, args.root), run_dir=args.run_dir, poll_s=args.poll)
    app.run()
    # The terminal is restored, the stores are read-only and the jobs started here detached: the
    # interpreter's teardown of the app's objects would only delay the prompt (0.1 s of the 0.3 s
    # between q and the shell's prompt, on a 24-hour run).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(app.return_code or 0)


def poll_seconds(text: str) -> float:
    """--poll's value: 0.1 s to an hour (0, a negative or a NaN interval spun a core with a blank screen)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0.1 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0.1 to 3600")
    return seconds


def root_of(run_dir: Path | None, root: Path | None) -> Path:
    """Where the runs screen lists runs: --root, else beside the run given (`offloadlab tui OUT/RUN` lists
    OUT, not a ./runs that may not exist), else ./runs."""
    if root is not None:
        return root
    return run_dir.resolve().parent if run_dir is not None else Path("runs")
