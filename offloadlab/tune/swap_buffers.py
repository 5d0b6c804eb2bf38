"""Sizing ZeRO-3's pinned parameter swap buffers (offload_param = "nvme") for a spec's model, and the pinned
RAM DeepSpeed will hold for them and for the optimizer's swap buffers (offload_optimizer = "nvme").

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
AIO_ALIGNED_BYTES = 1024  # DeepSpeed rounds each swap buffer to this times intra_op_parallelism
FP32_BYTES = 4  # the optimizer swaps fp32 masters and moments


@dataclass(frozen=True)
class SwapBufferPlan:
    buffer_size: int
    buffer_count: int
    stage3_max_live_parameters: int
    stage3_max_reuse_distance: int
    largest_param_numel: int
    swapped_params: int
    element_size: int
    optimizer_buffer_count: int
    """0 when the optimizer state is not swapped to NVMe."""
    optimizer_buffer_numel: int
    """The largest sub-group's fp32 partition, aligned: DeepSpeed sizes every optimizer swap buffer to it."""

    @property
    def param_pinned_bytes(self) -> int:
        return self.buffer_size * self.buffer_count * self.element_size

    @property
    def optimizer_pinned_bytes(self) -> int:
        return self.optimizer_buffer_count * self.optimizer_buffer_numel * FP32_BYTES

    @property
    def pinned_bytes(self) -> int:
        return self.param_pinned_bytes + self.optimizer_pinned_bytes

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


def largest_sub_group(numels: list[int], sub_group_size: int) -> int:
    """DeepSpeed's ZeRO-3 sub-groups (stage3._create_fp16_sub_groups): parameters in order, a group closed
    once it reaches sub_group_size elements, so one can exceed it by its last parameter."""
    largest = current = 0
    for n in numels:
        current += n
        if current >= sub_group_size:
            largest, current = max(largest, current), 0
    return max(largest, current)


def _aligned(numel: int, alignment: int) -> int:
    return -(-numel // alignment) * alignment


def plan_swap_buffers(spec: RunSpec, strategy: DeepSpeedStrategy, intra_op_parallelism: int) -> SwapBufferPlan:
    with torch.device("meta"):
        model = build_model(spec.model, spec.seq_len, spec.seed)
    element_size = 2 if spec.precision == "bf16" else 4
    numels = [p.numel() for p in model.parameters() if p.numel() * element_size >= MIN_SWAPPED_BYTES]
    largest = max(p.numel() for p in model.parameters())
    # Whole elements per thread-aligned chunk, as DeepSpeed rounds each buffer.
    buffer_size = _aligned(largest, ALIGNMENT * intra_op_parallelism // element_size)
    swaps_optimizer = strategy.offload_optimizer == "nvme"
    sub_group = largest_sub_group([p.numel() for p in model.parameters()], strategy.sub_group_size)
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
        optimizer_buffer_count=strategy.optimizer_buffer_count if swaps_optimizer else 0,
        optimizer_buffer_numel=_aligned(sub_group, AIO_ALIGNED_BYTES * intra_op_parallelism // FP32_BYTES),
    )
