"""Measured speeds of the links offloaded bytes cross, other than the NVMe drive (that is `tune`'s job).

The planner bounds step times with these; `tune` reports the PCIe copy beside the drive's figures,
since a swap-in from NVMe ends on the GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PcieSpeed:
    host_to_device_gbps: float
    device_to_host_gbps: float


def measure_pinned_copy(nbytes: int = 256 << 20, repeats: int = 5) -> PcieSpeed | None:
    """Best of `repeats` pinned host<->GPU copies of `nbytes`; None without a GPU."""
    if not torch.cuda.is_available():
        return None
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def best_seconds(copy) -> float:
        copy()  # the first copy pays for mapping the buffers
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            copy()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return min(times)

    h2d = best_seconds(lambda: device.copy_(host, non_blocking=True))
    d2h = best_seconds(lambda: host.copy_(device, non_blocking=True))
    return PcieSpeed(host_to_device_gbps=nbytes / h2d / 1e9, device_to_host_gbps=nbytes / d2h / 1e9)
