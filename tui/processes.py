"""Start `offloadlab run` / `offloadlab tune` from the TUI as processes of their own, and stop them.

Each job gets its own session (setsid): closing or crashing the TUI, or Ctrl-C in its terminal, never
reaches the job. Stopping sends SIGTERM, which the CLI handles like Ctrl-C: it stops its workers and
removes what it created.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Job:
    kind: str
    """'run' or 'tune'."""
    out_dir: Path
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def describe(self) -> str:
        code = self.process.poll()
        state = "running" if code is None else f"exited {code}"
        return f"{self.kind} -> {self.out_dir.name} (pid {self.process.pid}, {state}; log {self.log_path.name})"

    def stop(self) -> None:
        if self.running:
            self.process.send_signal(signal.SIGTERM)


def _start(kind: str, args: list[str], out_dir: Path) -> Job:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # The log sits beside the run directory: the run owns its folder and removes it on failure.
    log_path = out_dir.parent / f".{out_dir.name}.log"
    with log_path.open("w") as log:
        # -P: the current folder is not searched, so an `offloadlab/` folder there is never imported.
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "offloadlab.cli", kind, *args, "--out", str(out_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "150"},
        )
    return Job(kind, out_dir, log_path, process)


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def start_run(spec_path: Path, root: Path) -> Job:
    if not spec_path.is_file():
        raise FileNotFoundError(f"{spec_path}: no such spec file")
    return _start("run", [str(spec_path)], root / f"{spec_path.stem}-{_stamp()}")


def start_tune(nvme_path: Path, root: Path, quick: bool = True) -> Job:
    return _start("tune", ["--nvme", str(nvme_path), *(["--quick"] if quick else [])], root / f"tune-{_stamp()}")
