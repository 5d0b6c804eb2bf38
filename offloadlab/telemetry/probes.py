"""What a training rank reads of itself at each step: the device's memory peaks, its own RSS peak and block
I/O, and its device's name. The only telemetry module that imports torch; ranks call it, the sampler does not.

Peak GPU figures come from `torch.cuda.memory_stats()` after `reset_device_peaks()` at each step's start, so
each step reports its own peak, as torchtitan does.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class DeviceMemory:
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    peak_active_bytes: int | None


def reset_device_peaks() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def device_memory() -> DeviceMemory:
    """Peaks since the last reset; None on a machine without CUDA."""
    if not torch.cuda.is_available():
        return DeviceMemory(None, None, None)
    stats = torch.cuda.memory_stats()
    return DeviceMemory(
        peak_allocated_bytes=stats.get("allocated_bytes.all.peak"),
        peak_reserved_bytes=stats.get("reserved_bytes.all.peak"),
        peak_active_bytes=stats.get("active_bytes.all.peak"),
    )


def host_rss_peak_bytes() -> int:
    """This process's lifetime peak resident set (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def process_io_bytes() -> tuple[int, int]:
    """(read, written) block-layer bytes of this process's threads, DeepSpeed's aio threads included. The
    sampler runs in a process of its own, so its store writes are not counted here."""
    read = written = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = dict(line.split(": ") for line in (task / "io").read_text().splitlines())
        except OSError:
            continue  # the thread ended between listing and reading
        read += int(fields["read_bytes"])
        written += int(fields["write_bytes"])
    return read, written


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def device_memory_total(device: torch.device) -> int | None:
    """The GPU's memory in bytes; None on the CPU."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
