"""The run folder: the one place its layout is spelled, every path checked to stay inside it, and the lock
that makes it one run's alone.

    RUN_DIR/                   the folder itself is flock'ed by the process that runs or tunes here, for its
                               whole life (a lock file could be deleted mid-run; the folder cannot)
        offloadlab.sqlite      the run store (stays)
        .offloadlab-reserve    space held for the run's last store writes, freed when its disk fills or it ends
        spec.toml  logs/NAME.log
        tokens.npy             the run's text tokenized once for every rank (removed at the end)
        checkpoints/NAME/  scratch/NAME/  tmp/NAME/     made by the run and removed after each strategy

    NVME_PATH/offloadlab-RUN-TOKEN-NAME/    a strategy's swap folder, holding an owner marker
        .offloadlab-owner      names the run folder by device and inode, and a secret the store records:
                               what a later run's sweep must see before it removes the folder
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import stat
from dataclasses import dataclass
from pathlib import Path

from offloadlab.spec import SpecError

DB_NAME = "offloadlab.sqlite"
NVME_PREFIX = "offloadlab-"
OWNER_MARKER = ".offloadlab-owner"
RESERVE_NAME = ".offloadlab-reserve"
# Room for the store's last writes (each strategy's reason, the run's status: a few WAL pages) once the
# run's own writes have filled the disk; without it the run read as "killed" instead of "disk full".
RESERVE_BYTES = 4 << 20


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
    def tokens_cache(self) -> Path:
        """The run's text as token ids, tokenized once by the parent for every rank; removed at the end."""
        return self.root / "tokens.npy"

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
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
        holds nothing, whatever its store says, and neither does a copy of a live run's folder."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the shared lock taken for the test
        return False

    def reserve_space(self) -> None:
        """Allocate the reserve (real blocks: a sparse file would free nothing)."""
        fd = os.open(self.root / RESERVE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as err:
            os.unlink(self.root / RESERVE_NAME)
            raise RunDirError(
                f"{self.root} has no room for a run ({err.strerror}): free space there or pass another --out"
            ) from None
        finally:
            os.close(fd)

    def release_space(self) -> None:
        (self.root / RESERVE_NAME).unlink(missing_ok=True)

    def identity(self) -> tuple[int, int]:
        """(device, inode) of the folder: a copy or a crafted folder at another path has another."""
        st = os.stat(self.root)
        return st.st_dev, st.st_ino

    def mark_swap_folder(self, swap_dir: Path, secret: str) -> None:
        """Written into a swap folder the run has just made, before anything else goes there."""
        device, inode = self.identity()
        marker = {"run_folder": str(self.root), "device": device, "inode": inode, "secret": secret}
        fd = os.open(swap_dir / OWNER_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(marker, f)

    def owns_swap_folder(self, swap_dir: Path, secret: str) -> bool:
        """Whether swap_dir is provably this folder's: a real folder (not a link) named as the run names
        them, whose marker names this very folder (device and inode) and the secret its store recorded."""
        try:
            if not stat.S_ISDIR(os.lstat(swap_dir).st_mode) or not swap_dir.name.startswith(NVME_PREFIX):
                return False
            fd = os.open(swap_dir / OWNER_MARKER, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                marker = json.loads(f.read(4096))
            return (
                isinstance(marker, dict)
                and (marker.get("device"), marker.get("inode")) == self.identity()
                and marker.get("secret") == secret
            )
        except (OSError, ValueError):
            return False


def is_disk_full(err: BaseException) -> bool:
    """ENOSPC, as the OS or SQLite (whose error carries no errno) says it."""
    return isinstance(err, OSError) and err.errno == errno.ENOSPC or "database or disk is full" in str(err)


@contextlib.contextmanager
def signals_ignored():
    """Cleanup runs to its end: a second Ctrl-C (or a SIGTERM, a SIGHUP) no longer cuts it short."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
