"""One measurement of DeepSpeed's aio handle (and of plain O_DIRECT) on files under a tuning work folder.

The handle aborts the whole process on a read past the end of a file, so every size is checked here
before the handle sees it.
"""

from __future__ import annotations

import mmap
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from offloadlab.checks.host import DIRECT_IO_ALIGNMENT as ALIGNMENT
from offloadlab.spec import AioSettings

# DeepSpeed 0.19.8's defaults (runtime/swap_tensor/constants.py): what a user gets without tuning.
DEEPSPEED_DEFAULT = AioSettings()


@dataclass(frozen=True)
class Throughput:
    read_gbps: float
    write_gbps: float


def check_io_size(io_size: int, point: AioSettings) -> None:
    if io_size <= 0 or io_size % (ALIGNMENT * point.intra_op_parallelism):
        raise ValueError(
            f"io_size {io_size} must be a positive multiple of {ALIGNMENT} x intra_op_parallelism "
            f"({point.intra_op_parallelism}): each thread's share must stay O_DIRECT-aligned"
        )


def _handle(point: AioSettings):
    from offloadlab.engines.ops import load_op

    aio = load_op("async_io")
    # DeepSpeed's async_io warns once a process, through its logger, that offloading wears consumer SSDs;
    # plan and tune only time a few files, and the warning landed in the middle of their tables. The op's
    # own marker (deepspeed_aio_op_desc.cpp) says it was given. A run's ranks, which do offload, still log it.
    import deepspeed.utils

    deepspeed.utils._deepspeed_nvme_write_warning_emitted = True
    return aio.aio_handle(
        block_size=point.block_size,
        queue_depth=point.queue_depth,
        single_submit=point.single_submit,
        overlap_events=point.overlap_events,
        intra_op_parallelism=point.intra_op_parallelism,
    )


class AioBench:
    """Times writes then reads of one `io_size` file through a handle built for each point.

    One page-locked buffer serves every point (allocating it per point would time mlock, not I/O).
    """

    def __init__(self, work_dir: Path, io_size: int):
        self.work_dir, self.io_size = work_dir, io_size
        self.path = work_dir / "aio-probe.bin"
        self._pin_handle = _handle(DEEPSPEED_DEFAULT)
        self.buffer = self._pin_handle.new_cpu_locked_tensor(io_size, torch.empty(0, dtype=torch.uint8))
        self.buffer.fill_(0x5A)

    def close(self) -> None:
        self._pin_handle.free_cpu_locked_tensor(self.buffer)
        self.path.unlink(missing_ok=True)

    def measure(self, point: AioSettings) -> Throughput:
        check_io_size(self.io_size, point)
        handle = _handle(point)
        start = time.perf_counter()
        handle.sync_pwrite(self.buffer, str(self.path))
        written = time.perf_counter() - start
        size = self.path.stat().st_size
        if size < self.io_size:
            raise RuntimeError(
                f"{self.path} holds {size} bytes after writing {self.io_size}: the drive is full or failing"
            )
        start = time.perf_counter()
        handle.sync_pread(self.buffer, str(self.path))
        read = time.perf_counter() - start
        return Throughput(read_gbps=self.io_size / read / 1e9, write_gbps=self.io_size / written / 1e9)


def measure_direct_io_baseline(work_dir: Path, io_size: int, chunk: int = 1 << 20, repeats: int = 3) -> Throughput:
    """Plain single-threaded sequential O_DIRECT writes then reads in `chunk` pieces: the no-aio floor."""
    if io_size % chunk:
        raise ValueError(f"io_size {io_size} must be a multiple of the chunk {chunk}")
    path = work_dir / "direct-probe.bin"
    buf = mmap.mmap(-1, chunk)
    buf.write(b"\x5a" * chunk)
    reads, writes = [], []
    try:
        for _ in range(repeats):
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o600)
            start = time.perf_counter()
            for offset in range(0, io_size, chunk):
                os.pwritev(fd, [buf], offset)
            os.fsync(fd)
            writes.append(io_size / (time.perf_counter() - start) / 1e9)
            os.close(fd)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            start = time.perf_counter()
            for offset in range(0, io_size, chunk):
                os.preadv(fd, [buf], offset)
            reads.append(io_size / (time.perf_counter() - start) / 1e9)
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    return Throughput(read_gbps=statistics.mean(reads), write_gbps=statistics.mean(writes))
