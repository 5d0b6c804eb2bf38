"""Checks that run before any work, each failing with a `PreflightError` that names the fix."""

from __future__ import annotations

import mmap
import os
import shutil
import sys
import uuid
from pathlib import Path

import psutil

from offloadlab.spec import DeepSpeedStrategy, RunSpec, SpecError

# DeepSpeed's O_DIRECT transfers are aligned to this (AIO_ALIGNED_BYTES in swap_tensor/utils.py).
DIRECT_IO_ALIGNMENT = 4096
# Bytes per parameter DeepSpeed keeps in the NVMe swap folder: fp32 master, Adam m and v, fp32 gradient.
OPTIMIZER_SWAP_BYTES_PER_PARAM = 16


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
        raise PreflightError(f"{role} {path} is not writable by this user: choose a folder you own, or fix its permissions")


def check_direct_io(path: Path, role: str) -> None:
    """Write and read one aligned block with O_DIRECT, as DeepSpeed's aio does; remove the probe file."""
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
        raise PreflightError(
            f"{role} {path} ({fstype}) does not support O_DIRECT ({err.strerror}): use a folder on a local ext4/xfs NVMe drive"
        ) from None
    finally:
        probe.unlink(missing_ok=True)


def check_free_disk(path: Path, needed_bytes: int, role: str) -> None:
    free = shutil.disk_usage(path).free
    if free < needed_bytes:
        raise PreflightError(
            f"{role} {path} has {free / 2**30:.1f} GiB free, {needed_bytes / 2**30:.1f} GiB needed: free space or use a larger drive"
        )


def choose_deepspeed_accelerator() -> None:
    """Before DeepSpeed is first imported: its accelerator is picked once, at import. Its ops build into
    the venv's own folder (see offloadlab.ops), whoever loads them first."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if _has_cuda() else "cpu")
    if "TORCH_EXTENSIONS_DIR" not in os.environ and os.access(sys.prefix, os.W_OK):
        # In the environment, so torch and every process started from here (torchrun, the ranks) agree.
        os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(sys.prefix) / "torch_extensions")


def check_buffer_fits_largest_param(strategy: DeepSpeedStrategy, largest_param_numel: int) -> None:
    if strategy.offload_param == "nvme" and strategy.buffer_size < largest_param_numel:
        raise PreflightError(
            f"strategy {strategy.name}: buffer_size = {strategy.buffer_size:,} elements is smaller than the largest "
            f"parameter ({largest_param_numel:,} elements, usually the embedding): set buffer_size >= {largest_param_numel}"
        )


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def nvme_bytes_needed(strategy: DeepSpeedStrategy, n_params: int, param_bytes: int) -> int:
    """Swap-folder bytes a strategy needs on one host (its ranks' partitions add up to the whole model)."""
    total = 0
    if strategy.offload_param == "nvme":
        total += n_params * param_bytes
    if strategy.offload_optimizer == "nvme":
        total += n_params * OPTIMIZER_SWAP_BYTES_PER_PARAM
    return total


def checkpoint_bytes_needed(strategy, n_params: int, param_bytes: int) -> int:
    """Run-directory bytes while a strategy's checkpoint is verified.

    A checkpoint holds fp32 weights and both Adam moments (12 bytes a parameter; measured on ZeRO-3 NVMe,
    ZeRO-3 CPU and FSDP2 checkpoints), ZeRO-1/2 add the low-precision module copy. DeepSpeed's restore
    check saves the restored state once more beside the checkpoint, so its peak is two copies.
    """
    if isinstance(strategy, DeepSpeedStrategy):
        return 2 * n_params * (12 + (param_bytes if strategy.zero_stage < 3 else 0))
    return 12 * n_params


def _nearest_existing(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def check_disk_for_run(spec: RunSpec, run_dir: Path, n_params: int) -> None:
    """Strategies run one after another and each one's swap folder and checkpoint are removed after it:
    the largest strategy must fit, swap and checkpoint together where both are on one filesystem."""
    param_bytes = 2 if spec.precision == "bf16" else 4
    run_fs = _nearest_existing(run_dir)
    nvme_fs = spec.nvme_path if any(s.uses_nvme for s in spec.strategy) else None
    same_fs = nvme_fs is not None and os.stat(nvme_fs).st_dev == os.stat(run_fs).st_dev
    for strategy in spec.strategy:
        swap = 1.1 * nvme_bytes_needed(strategy, n_params, param_bytes) if isinstance(strategy, DeepSpeedStrategy) else 0
        checkpoint = checkpoint_bytes_needed(strategy, n_params, param_bytes) if spec.verify_checkpoint else 0
        fix = " (or set verify_checkpoint = false, or pass --out on another drive)" if checkpoint else ""
        try:
            if same_fs:
                check_free_disk(nvme_fs, int(swap + checkpoint), f"strategy {strategy.name!r}: nvme_path (swap + checkpoint)")
            else:
                if swap:
                    check_free_disk(nvme_fs, int(swap), f"strategy {strategy.name!r}: nvme_path (swap)")
                if checkpoint:
                    check_free_disk(run_fs, int(checkpoint), f"strategy {strategy.name!r}: run directory (checkpoint)")
        except PreflightError as err:
            raise PreflightError(f"{err}{fix}") from None


def preflight_run(spec: RunSpec, run_dir: Path) -> None:
    """Everything `offloadlab run` can check before it starts a process; run_dir need not exist yet."""
    from offloadlab.model import gpt_config

    shape = gpt_config(spec.model, spec.seq_len) if spec.model.hf_config is None else None
    nvme = [s for s in spec.strategy if s.uses_nvme]
    if nvme:
        check_directory(spec.nvme_path, "nvme_path")
        check_direct_io(spec.nvme_path, "nvme_path")
        from offloadlab.ops import check_libaio

        check_libaio()
    if shape is None:
        return
    for strategy in nvme:
        check_buffer_fits_largest_param(strategy, shape.largest_param_numel)
    check_disk_for_run(spec, run_dir, shape.n_params)


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
            f"{pinned_bytes / 2**30:.1f} GiB of pinned buffers asked for, {available / 2**30:.1f} GiB of RAM available: "
            "lower buffer_count/buffer_size (or io size) or free memory"
        )
    soft = memlock_limit_bytes()
    if soft is not None and pinned_bytes > soft:
        raise PreflightError(
            f"ulimit -l is {soft // 1024} KiB but {pinned_bytes // 1024} KiB must be page-locked: raise it "
            "(ulimit -l unlimited, or memlock in /etc/security/limits.conf) and start a new shell"
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
