"""The run folder: the one place its layout is spelled, every path checked to stay inside it, and the lock
that makes it one run's alone.

    RUN_DIR/
        offloadlab.sqlite      the run store (stays)
        .offloadlab.lock       held (flock) by the process that runs or tunes here, for its whole life
        spec.toml  logs/NAME.log
        checkpoints/NAME/  scratch/NAME/  tmp/NAME/     made by the run and removed after each strategy
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from offloadlab.spec import SpecError

DB_NAME = "offloadlab.sqlite"
LOCK_NAME = ".offloadlab.lock"
NVME_PREFIX = "offloadlab-"


class RunDirError(SpecError):
    """The run folder cannot be used; the message says why and what to pass instead."""


@dataclass(frozen=True)
class RunDir:
    root: Path
    """Absolute, with links resolved: containment checks compare resolved paths."""

    @classmethod
    def at(cls, path: Path) -> "RunDir":
        return cls(Path(path).resolve())

    def inside(self, *parts: str) -> Path:
        """root/parts, refused if it would lie outside root (a name with '..' or a link out of the folder)."""
        path = self.root.joinpath(*parts)
        if not path.resolve().is_relative_to(self.root):
            raise RunDirError(f"{path} would lie outside the run folder {self.root}")
        return path

    @property
    def store_path(self) -> Path:
        return self.root / DB_NAME

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    def log(self, strategy: str) -> Path:
        return self.inside("logs", f"{strategy}.log")

    def checkpoints(self, strategy: str) -> Path:
        return self.inside("checkpoints", strategy)

    def scratch(self, strategy: str) -> Path:
        return self.inside("scratch", strategy)

    def job_tmp(self, strategy: str) -> Path:
        """TMPDIR of a strategy's job: torchrun leaves a torchelastic_* folder in it at every launch."""
        return self.inside("tmp", strategy)

    def per_strategy_folders(self, strategy: str) -> list[Path]:
        return [self.checkpoints(strategy), self.scratch(strategy), self.job_tmp(strategy)]

    def nvme_dir(self, nvme_path: Path, run_token: str, strategy: str) -> Path:
        """A strategy's swap folder under the user's NVMe path, named so no other run (or user file) shares it."""
        safe_run = re.sub(r"[^A-Za-z0-9._+-]", "_", self.root.name)[:40]
        path = Path(nvme_path).resolve() / f"{NVME_PREFIX}{safe_run}-{run_token}-{strategy}"
        if path.parent != Path(nvme_path).resolve():
            raise RunDirError(f"{path} would lie outside nvme_path {nvme_path}")
        return path

    def lock(self) -> int:
        """Take the folder for this process's life (the kernel drops the lock when the process ends);
        the returned descriptor is kept open for that. Refused while another process holds it."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirError(
                f"another offloadlab process is running or tuning in {self.root}: wait for it, or pass another --out"
            ) from None
        return fd

    def is_live(self) -> bool:
        """Whether a process holds the folder now: a run whose process died (a closed terminal, SIGKILL)
        holds nothing, whatever its store says."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the shared lock taken for the test
        return False


@contextlib.contextmanager
def signals_ignored():
    """Cleanup runs to its end: a second Ctrl-C (or a SIGTERM, a SIGHUP) no longer cuts it short."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
