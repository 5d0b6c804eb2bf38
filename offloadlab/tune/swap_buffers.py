"""Sizing ZeRO-3's pinned parameter swap buffers (offload_param = "nvme") for a spec's model, and the pinned
RAM DeepSpeed will hold for them and for the optimizer's swap buffers (offload_optimizer = "nvme").

DeepSpeed gives each swapped-in parameter a whole buffer of `buffer_size` elements, so buffer_size must hold
the largest parameter, and buffer_count must cover the parameters held at once: once the first micro-batch
has traced the model, those used again within stage3_max_reuse_distance elements are kept
(plan.deepspeed.params_held_at_turn, the least that runs, which `run` checks), and prefetching reaches
stage3_max_live_parameters plus the prefetch bucket ahead (what the tuner sizes, so prefetches do not wait).
Too few buffers stop the run at the second micro-batch with `Not enough buffers 0 for swapping 1`; each
buffer costs buffer_size x element size of pinned RAM.
"""

from __future__ import annotations

from dataclasses import dataclass

from offloadlab.checks.host import DIRECT_IO_ALIGNMENT as ALIGNMENT
from offloadlab.plan.accounting import shape_of_spec
from offloadlab.plan.deepspeed import sub_groups, swapped_numels
from offloadlab.spec import AioSettings, DeepSpeedStrategy, RunSpec

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


def _aligned(numel: int, alignment: int) -> int:
    return -(-numel // alignment) * alignment


def plan_swap_buffers(spec: RunSpec, strategy: DeepSpeedStrategy, aio: AioSettings) -> SwapBufferPlan:
    """Buffers for the spec's model at the aio settings the run will use (the tune's fastest)."""
    shape = shape_of_spec(spec)
    # Four blocks live keeps the prefetch ahead of compute without pinning the whole model.
    max_live = min(strategy.stage3_max_live_parameters, 4 * shape.block_params)
    swapped = swapped_numels(shape, strategy, spec.nproc, aio)
    # Whole elements per thread-aligned chunk, as DeepSpeed rounds each buffer.
    buffer_size = _aligned(shape.largest_param_numel, ALIGNMENT * aio.intra_op_parallelism // shape.param_bytes)
    sub_group = max(sub_groups(shape, spec.nproc, strategy.sub_group_size))
    return SwapBufferPlan(
        buffer_size=buffer_size,
        buffer_count=max_params_in_window(swapped, max_live + strategy.stage3_prefetch_bucket_size) + SAFETY_BUFFERS,
        stage3_max_live_parameters=max_live,
        stage3_max_reuse_distance=max_live,
        largest_param_numel=shape.largest_param_numel,
        swapped_params=len(swapped),
        element_size=shape.param_bytes,
        optimizer_buffer_count=strategy.optimizer_buffer_count if strategy.offload_optimizer == "nvme" else 0,
        optimizer_buffer_numel=_aligned(sub_group, AIO_ALIGNED_BYTES * aio.intra_op_parallelism // FP32_BYTES),
    )
