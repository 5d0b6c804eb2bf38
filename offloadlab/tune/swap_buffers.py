"""Sizing ZeRO-3's pinned parameter swap buffers (offload_param = "nvme") for a spec's model.

DeepSpeed gives each swapped-in parameter a whole buffer of `buffer_size` elements, so buffer_size must hold
the largest parameter, and buffer_count must cover every parameter that can be live at once: those within
stage3_max_live_parameters elements of the one in use, plus the prefetch bucket. Too few buffers stop a run
with `Not enough buffers 0 for swapping 1`; each buffer costs buffer_size x element size of pinned RAM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from offloadlab.checks.host import DIRECT_IO_ALIGNMENT as ALIGNMENT
from offloadlab.spec import DeepSpeedStrategy, RunSpec
from offloadlab.workload.model import build_model

MIN_SWAPPED_BYTES = 1 << 20  # DeepSpeed keeps smaller parameters in RAM (MIN_AIO_BYTES)
SAFETY_BUFFERS = 2  # the embedding and head are fetched outside the block order


@dataclass(frozen=True)
class SwapBufferPlan:
    buffer_size: int
    buffer_count: int
    stage3_max_live_parameters: int
    stage3_max_reuse_distance: int
    largest_param_numel: int
    swapped_params: int
    element_size: int

    @property
    def pinned_bytes(self) -> int:
        return self.buffer_size * self.buffer_count * self.element_size

    def as_strategy_fields(self) -> dict:
        return {
            "buffer_size": self.buffer_size,
            "buffer_count": self.buffer_count,
            "stage3_max_live_parameters": self.stage3_max_live_parameters,
            "stage3_max_reuse_distance": self.stage3_max_reuse_distance,
        }


def max_params_in_window(numels: list[int], capacity: int) -> int:
    """The most consecutive parameters (in forward order) whose elements fit in `capacity`."""
    best, total, left = 0, 0, 0
    for right, n in enumerate(numels):
        total += n
        while total > capacity and left <= right:
            total -= numels[left]
            left += 1
        best = max(best, right - left + 1)
    return max(best, 1)


def plan_swap_buffers(spec: RunSpec, strategy: DeepSpeedStrategy, intra_op_parallelism: int) -> SwapBufferPlan:
    with torch.device("meta"):
        model = build_model(spec.model, spec.seq_len, spec.seed)
    element_size = 2 if spec.precision == "bf16" else 4
    numels = [p.numel() for p in model.parameters() if p.numel() * element_size >= MIN_SWAPPED_BYTES]
    largest = max(p.numel() for p in model.parameters())
    # Whole elements per thread-aligned chunk, as DeepSpeed rounds each buffer.
    align = ALIGNMENT * intra_op_parallelism // element_size
    buffer_size = -(-largest // align) * align
    block_numel = max(sum(p.numel() for p in block.parameters()) for block in model.blocks)
    # Four blocks live keeps the prefetch ahead of compute without pinning the whole model.
    max_live = min(strategy.stage3_max_live_parameters, 4 * block_numel)
    window = max_params_in_window(numels, max_live + strategy.stage3_prefetch_bucket_size) if numels else 1
    return SwapBufferPlan(
        buffer_size=buffer_size,
        buffer_count=min(window + SAFETY_BUFFERS, max(len(numels), 1) + SAFETY_BUFFERS),
        stage3_max_live_parameters=max_live,
        stage3_max_reuse_distance=max_live,
        largest_param_numel=largest,
        swapped_params=len(numels),
        element_size=element_size,
    )
