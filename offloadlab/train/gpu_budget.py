"""A GPU memory budget: one large GPU held to what a smaller one (24, 48, 80 GiB) would have.

A GPU of G GiB holds the CUDA context, NCCL's buffers and the caching allocator's blocks. torch can cap only
the allocator (`set_per_process_memory_fraction`), so its cap is G less what lives outside it, measured on
this rank's GPU: before the engine is built (the context), after (NCCL's communicators and whatever
the engine's libraries took) and after the first step (cuBLAS's handles and workspaces). Each time the
cap tightens by what appeared outside the allocator since; on the H200, 0.14 GiB appeared in the first step.
An allocation past the cap raises torch's OutOfMemoryError, which the worker records as "does not fit"
like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GiB = 1 << 30


class GpuBudgetError(RuntimeError):
    """The budget leaves the allocator nothing: the GPU's fixed costs alone exceed it."""


def holds_a_gpu_of(limit_gib: float | None, gpu_total_bytes: int | float | None) -> bool:
    """Whether a budget has a GPU to hold: one is set, there is a CUDA GPU, and the budget is below its size
    (at or above it the whole GPU is used, as without a budget)."""
    return limit_gib is not None and gpu_total_bytes is not None and limit_gib * GiB < gpu_total_bytes


def allocator_cap_bytes(budget_bytes: int, outside_allocator_bytes: int) -> int:
    """What torch's allocator may reserve so that everything on the GPU stays within the budget."""
    cap = budget_bytes - outside_allocator_bytes
    if cap <= 0:
        raise GpuBudgetError(
            f"a GPU memory budget of {budget_bytes / GiB:.2f} GiB is smaller than what the GPU holds outside "
            f"torch's allocator ({outside_allocator_bytes / GiB:.2f} GiB: the CUDA context, NCCL): "
            "raise gpu_memory_limit_gib"
        )
    return cap


def allocator_fraction(budget_bytes: int, outside_allocator_bytes: int, total_bytes: int) -> float:
    """The share of the GPU's memory `set_per_process_memory_fraction` takes for that cap (at most all)."""
    return min(1.0, allocator_cap_bytes(budget_bytes, outside_allocator_bytes) / total_bytes)


@dataclass(frozen=True)
class GpuBudget:
    """A budget in bytes for one rank's GPU; `apply` (re)sets the allocator's cap from what it sees now."""

    budget_bytes: int
    device: torch.device

    @classmethod
    def for_rank(cls, limit_gib: float | None, device: torch.device) -> "GpuBudget | None":
        """None where there is nothing to hold: no budget, no CUDA device (the CPU cannot be capped this
        way), or a budget at least the GPU's size."""
        total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        return cls(int(limit_gib * GiB), device) if holds_a_gpu_of(limit_gib, total) else None

    def outside_allocator_bytes(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return max(0, total - free - torch.cuda.memory_reserved(self.device))

    def apply(self) -> float:
        """Cap the allocator; returns the fraction set. Called again as fixed costs grow, it tightens."""
        total = torch.cuda.get_device_properties(self.device).total_memory
        fraction = allocator_fraction(self.budget_bytes, self.outside_allocator_bytes(), total)
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        return fraction
