"""Which CPU cores a rank trains on, and how many threads its CPU optimizer runs.

The CPU optimizer is most of an offloaded step (69% of ZeRO-2's on an H200 host), and it is an OpenMP
loop (DeepSpeed's CPU Adam) or torch's intra-op pool (torch's AdamW), both sized by OMP_NUM_THREADS and
the affinity mask. torchrun sets OMP_NUM_THREADS=1 whenever it starts more than one rank, so without this
each rank's optimizer ran on one core. Each rank on a host gets its own run of physical cores (one
hardware thread of each: two threads of one core share its vector units), and as many threads."""

from __future__ import annotations

import os
from pathlib import Path

from offloadlab.spec import SpecError

SYS_CPU = Path("/sys/devices/system/cpu")


def physical_cores() -> list[int]:
    """One CPU id per physical core this process may run on (its affinity mask), the lowest of each."""
    allowed = sorted(os.sched_getaffinity(0))
    first_of_core: dict[tuple[str, str], int] = {}
    for cpu in allowed:
        topology = SYS_CPU / f"cpu{cpu}" / "topology"
        try:
            key = ((topology / "physical_package_id").read_text(), (topology / "core_id").read_text())
        except OSError:  # no topology (some containers): every CPU counts as a core
            key = ("", str(cpu))
        first_of_core.setdefault(key, cpu)
    return sorted(first_of_core.values())


def cores_for_rank(
    local_rank: int, local_ranks: int, per_rank: int | None, cores: list[int] | None = None
) -> list[int]:
    """The physical cores of one rank of local_ranks on this host: per_rank of them (default: an equal
    share of the host's, at least one), the rank's own run of them."""
    cores = physical_cores() if cores is None else cores
    count = per_rank or max(1, len(cores) // local_ranks)
    if count * local_ranks > len(cores):
        if per_rank is not None:
            raise SpecError(
                f"cpu_cores_per_rank = {per_rank} for {local_ranks} rank(s) needs {per_rank * local_ranks} physical "
                f"cores; this host lets offloadlab use {len(cores)}: lower cpu_cores_per_rank or leave it out"
            )
        return cores  # more ranks than cores: they share them all
    return cores[local_rank * count : (local_rank + 1) * count]


def pin_this_rank(cores: list[int]) -> None:
    """Bind this process to cores and size torch's and OpenMP's thread pools to them."""
    import torch

    os.sched_setaffinity(0, cores)
    os.environ["OMP_NUM_THREADS"] = str(len(cores))  # for processes the rank starts (ZenFlow's worker)
    torch.set_num_threads(len(cores))
