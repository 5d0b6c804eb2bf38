"""What this machine allows, checked before any work: folders, O_DIRECT, free disk, page-locked memory and
aio events, and where a command may write. Shared by run, tune, plan, report, init and doctor; each check
fails with a `PreflightError` naming the fix."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import sys
import uuid
from importlib.metadata import version
from pathlib import Path

import psutil

from offloadlab.spec import SpecError

# torch's pinned-memory allocator rounds each allocation up to a power of two. DeepSpeed pins its swap
# buffers, gradient partitions and max_in_cpu parameters as a few multi-GB tensors, so the rounding locks
# up to twice their size in RAM (48 parameter buffers of 206 MB, 9.2 GiB, take 16). Above 64 MiB the
# allocator then takes what is asked; a user's own allocator settings are left as they are.
PINNED_EXACT_ABOVE = "pinned_max_round_threshold_mb:64"


# DeepSpeed's O_DIRECT transfers are aligned to this (AIO_ALIGNED_BYTES in swap_tensor/utils.py).
DIRECT_IO_ALIGNMENT = 4096


class PreflightError(SpecError):
    """The machine or a path cannot do what was asked; the message says how to fix it."""


def filesystem_type(path: Path) -> str:
    """The mount's filesystem type for `path` (the longest mount point that contains it)."""
    path = path.resolve()
    best, fstype = "", "unknown"
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        if (str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
            best, fstype = mount, part.fstype
    return fstype


def check_directory(path: Path, role: str) -> None:
    if not path.exists():
        raise PreflightError(f"{role} {path} does not exist: create it on the drive to use, or pass another path")
    if not path.is_dir():
        raise PreflightError(f"{role} {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise PreflightError(
            f"{role} {path} is not writable by this user: choose a folder you own, or fix its permissions"
        )


def nearest_existing(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def check_writable(path: Path, role: str) -> None:
    """`path` (a file or folder, made if missing) can be written: the part of it that exists takes new
    entries. A read-only mount, or a folder this user may not write, is named before any work is done
    rather than by a traceback when its result is written."""
    existing = nearest_existing(path)
    if existing != path.resolve() and not existing.is_dir():
        raise PreflightError(f"{role} {path} cannot be made: {existing} is a file")
    if not os.access(existing, os.W_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        why = "is on a read-only filesystem" if read_only else "is not writable by this user"
        raise PreflightError(f"{role} {path} cannot be written: {existing} {why}; pass a path on a writable drive")


def check_folder_to_write(path: Path, role: str) -> None:
    if path.exists() and not path.is_dir():
        raise PreflightError(f"{role} {path} is a file: pass a folder")
    check_writable(path, role)


def check_file_to_write(path: Path, role: str) -> None:
    if path.is_dir():
        raise PreflightError(f"{role} {path} is a folder: pass the path of the file to write")
    check_writable(path, role)


def check_new_files(folder: Path, names: list[str], force: bool) -> None:
    """Before a command writes `names` into the user's `folder`: a file of one of those names is the
    user's, even one an earlier offloadlab command wrote, and stays unless --force; a link out of the
    folder is never written through, --force or not."""
    root = folder.resolve()
    present = [folder / name for name in names if os.path.lexists(folder / name)]
    outside = [path for path in present if not path.resolve().is_relative_to(root)]
    if outside:
        links = ", ".join(f"{path} -> {path.resolve()}" for path in outside)
        raise PreflightError(
            f"{links}: a link out of {folder}, never written through: remove it, or pass another folder "
            "(nothing was written)"
        )
    if present and not force:
        raise PreflightError(
            f"{folder} already holds {', '.join(path.name for path in present)}: pass --force to overwrite, "
            "or another folder (nothing was written)"
        )


def check_torch_extensions_dir() -> None:
    """TORCH_EXTENSIONS_DIR, where the user set it, is where DeepSpeed's ops are built, flock'ed and loaded
    from: a folder that exists and takes writes. A missing one would have every op rebuilt, for minutes,
    into a folder made for it. Checked before offloadlab sets it itself (to the venv's own folder, which
    setup builds the ops into)."""
    value = os.environ.get("TORCH_EXTENSIONS_DIR")
    if value is None:
        return
    role = "TORCH_EXTENSIONS_DIR"
    if not Path(value).is_dir():
        raise PreflightError(
            f"{role} {value} is not a folder: DeepSpeed's ops are built and loaded there; create it to build "
            f"them there (minutes), or unset it to use those built into {sys.prefix}"
        )
    check_writable(Path(value), role)


def check_direct_io(path: Path, role: str, needed_bytes: int | None = None) -> None:
    """Write and read one aligned block with O_DIRECT, as DeepSpeed's aio does; remove the probe file.
    needed_bytes: what the command will write there, named if the drive is full."""
    fstype = filesystem_type(path)
    if fstype in ("tmpfs", "ramfs"):
        raise PreflightError(
            f"{role} {path} is on {fstype}, which is RAM and has no O_DIRECT: point it at a folder on the NVMe drive"
        )
    probe = path / f".offloadlab-odirect-{uuid.uuid4().hex}"
    buf = mmap.mmap(-1, DIRECT_IO_ALIGNMENT)  # page-aligned, as O_DIRECT requires
    buf.write(b"\xa5" * DIRECT_IO_ALIGNMENT)
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_DIRECT, 0o600)
        try:
            os.pwritev(fd, [buf], 0)
            os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
    except OSError as err:
        if err.errno == errno.ENOSPC:  # the probe's one block did not fit: a full drive, not a missing feature
            needed = "" if needed_bytes is None else f", {needed_bytes / 2**30:.2f} GiB needed"
            raise PreflightError(
                f"{role} {path} is full (ENOSPC: {shutil.disk_usage(path).free / 2**30:.2f} GiB free{needed}): "
                "free space there, or pass a folder on another drive"
            ) from None
        raise PreflightError(
            f"{role} {path} ({fstype}) does not support O_DIRECT ({err.strerror}): "
            "use a folder on a local ext4/xfs NVMe drive"
        ) from None
    finally:
        probe.unlink(missing_ok=True)


def check_free_disk(path: Path, needed_bytes: int, role: str) -> None:
    free = shutil.disk_usage(path).free
    if free < needed_bytes:
        raise PreflightError(
            f"{role} {path} has {free / 2**30:.1f} GiB free, {needed_bytes / 2**30:.1f} GiB needed: "
            "free space or use a larger drive"
        )


CAP_IPC_LOCK = 14  # linux/capability.h


def has_cap_ipc_lock(status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process may lock memory beyond RLIMIT_MEMLOCK. Being root is not enough: a container
    (Docker's default) drops the capability and keeps a 64 KiB-8 MiB limit."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return False


def memlock_limit_bytes() -> int | None:
    """Bytes this process may page-lock (`ulimit -l`); None when unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY or has_cap_ipc_lock() else soft


def pinned_memory_budget_bytes() -> int:
    """What page-locked buffers may take: 80% of the RAM available now, within `ulimit -l`."""
    budget = int(0.8 * psutil.virtual_memory().available)
    limit = memlock_limit_bytes()
    return budget if limit is None else min(budget, limit)


def check_pinned_memory(pinned_bytes: int) -> None:
    """Page-locked buffers need RAM that is free now and, without CAP_IPC_LOCK, a high enough `ulimit -l`."""
    available = psutil.virtual_memory().available
    if pinned_bytes > 0.8 * available:
        raise PreflightError(
            f"{pinned_bytes / 2**30:.1f} GiB of pinned buffers asked for, "
            f"{available / 2**30:.1f} GiB of RAM available: "
            "lower buffer_count/buffer_size (or io size) or free memory"
        )
    check_memlock(pinned_bytes)


def check_memlock(pinned_bytes: int) -> None:
    """Without CAP_IPC_LOCK, what is mlocked must fit `ulimit -l` (DeepSpeed's aio buffers are)."""
    soft = memlock_limit_bytes()
    if soft is not None and pinned_bytes > soft:
        raise PreflightError(
            f"ulimit -l is {soft // 1024} KiB but {pinned_bytes // 1024} KiB must be page-locked: raise it "
            "(ulimit -l unlimited, or memlock in /etc/security/limits.conf, and start a new shell; in a "
            "container, docker run --ulimit memlock=-1 or --cap-add IPC_LOCK)"
        )


def aio_events(proc_sys: Path = Path("/proc/sys/fs")) -> tuple[int, int] | None:
    """(events in use, fs.aio-max-nr), or None where /proc does not say (not Linux, or hidden)."""
    try:
        return int((proc_sys / "aio-nr").read_text()), int((proc_sys / "aio-max-nr").read_text())
    except OSError:
        return None


def check_aio_contexts(events_needed: int, proc_sys: Path = Path("/proc/sys/fs")) -> None:
    """Each aio handle thread reserves queue_depth events out of the kernel-wide fs.aio-max-nr."""
    events = aio_events(proc_sys)
    if events is None:
        return  # libaio itself will report a shortage
    used, limit = events
    if limit - used < events_needed:
        raise PreflightError(
            f"fs.aio-max-nr leaves {limit - used} aio events free, {events_needed} needed: "
            f"raise it with 'sysctl -w fs.aio-max-nr={max(limit * 2, used + events_needed * 2)}'"
        )


def sets_pinned_exact(environ) -> bool:
    """Whether `run` gives its workers PINNED_EXACT_ABOVE: on torch 2.13 or later, and only where the user
    set no allocator settings of their own."""
    # torch 2.11 rejects the key (every worker fails to start); 2.13 has it.
    torch_version = tuple(int(x) for x in version("torch").split(".")[:2])
    return (
        torch_version >= (2, 13) and "PYTORCH_ALLOC_CONF" not in environ and "PYTORCH_CUDA_ALLOC_CONF" not in environ
    )


def pinned_sizes_exact(environ) -> bool:
    """Whether the workers' pinned buffers take their exact sizes: with PINNED_EXACT_ABOVE, or the
    user's own allocator settings that include it. Otherwise each is rounded up to a power of two."""
    own = environ.get("PYTORCH_ALLOC_CONF", "") + environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return sets_pinned_exact(environ) or "pinned_max_round_threshold_mb" in own
