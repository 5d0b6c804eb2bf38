"""DeepSpeed's NVMe swap buffers: the one type (`SwapBuffers`), the pinned bytes they take, and how many a
model needs (used by plan, tune and run alike).

DeepSpeed gives each swapped-in parameter a whole buffer of `buffer_size` elements, so buffer_size must hold
the largest parameter, and buffer_count must cover the parameters held at once: once the first micro-batch
has traced the model, those used again within stage3_max_reuse_distance elements are kept
(`params_held_at_turn`, the least that runs, which `run` checks and `plan --write` writes at DeepSpeed's
default windows), and prefetching reaches stage3_max_live_parameters plus the prefetch bucket ahead (what
the tuner sizes at its narrower windows, so prefetches do not wait). Too few buffers stop the run at the
second micro-batch with `Not enough buffers 0 for swapping 1`. The optimizer's swapper holds
optimizer_buffer_count buffers of the largest sub-group's fp32 partition. DeepSpeed mlocks all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from offloadlab.checks.host import DIRECT_IO_ALIGNMENT as ALIGNMENT
from offloadlab.plan.accounting import Placement, Shape, shape_of_spec
from offloadlab.spec import AioSettings, DeepSpeedStrategy, RunSpec

MIN_SWAPPED_BYTES = 1 << 20  # DeepSpeed keeps smaller parameters in RAM (MIN_AIO_BYTES)
SAFETY_BUFFERS = 2  # the embedding and head are fetched outside the block order


def _default(field: str) -> int:
    """The spec's default, which is DeepSpeed's: spelled once, in the strategy type."""
    return DeepSpeedStrategy.model_fields[field].default


@dataclass(frozen=True)
class SwapBuffers:
    """The swap buffer settings of one DeepSpeed strategy, with the ZeRO-3 windows that decide how many
    parameters it holds at once; defaults are DeepSpeed's."""

    param_buffer_count: int = _default("buffer_count")
    param_buffer_size: int = _default("buffer_size")
    optimizer_buffer_count: int = _default("optimizer_buffer_count")
    stage3_max_live_parameters: int = _default("stage3_max_live_parameters")
    stage3_max_reuse_distance: int = _default("stage3_max_reuse_distance")

    @classmethod
    def of(cls, strategy: DeepSpeedStrategy) -> "SwapBuffers":
        """What the strategy asks for."""
        return cls(
            strategy.buffer_count,
            strategy.buffer_size,
            strategy.optimizer_buffer_count,
            strategy.stage3_max_live_parameters,
            strategy.stage3_max_reuse_distance,
        )

    def as_strategy_fields(self) -> dict:
        """The settings under the spec's own keys (a tune fragment's [swap_buffers])."""
        return {
            "buffer_size": self.param_buffer_size,
            "buffer_count": self.param_buffer_count,
            "stage3_max_live_parameters": self.stage3_max_live_parameters,
            "stage3_max_reuse_distance": self.stage3_max_reuse_distance,
        }


def _sub_group_members(partitions: list[int], size: int) -> list[list[int]]:
    """Indices of the parameters in each ZeRO-3 sub-group (see sub_groups)."""
    if sum(partitions) <= size:
        return [list(range(len(partitions)))]
    groups, current, numel = [], [], 0
    for i, n in enumerate(partitions):
        current.append(i)
        numel += n
        if numel >= size:
            groups, current, numel = groups + [current], [], 0
    return groups + ([current] if current else [])


def sub_groups(shape: Shape, world: int, size: int = 1_000_000_000) -> list[int]:
    """A rank's ZeRO-3 sub-groups in elements, as DeepSpeed forms them (stage3._create_fp16_sub_groups):
    parameter partitions, in the model's order, collected until a group reaches `size` (the strategy's
    sub_group_size; DeepSpeed's default 1e9)."""
    partitions = [math.ceil(numel / world) for numel in shape.param_numels]
    return [sum(partitions[i] for i in members) for members in _sub_group_members(partitions, size)]


def params_swapped(p: Placement, shape: Shape, world: int) -> list[int]:
    """Indices (in shape.param_numels) of the parameters DeepSpeed keeps on NVMe.

    DeepSpeed pins a max_in_cpu buffer but gives a sub-group a place in it only if the whole sub-group fits
    in what is left (stage3._create_fp16_partitions_with_defragmentation). Sub-groups are filled to at least
    sub_group_size, so with the defaults (both 1e9) a rank with more than 1e9 elements keeps none of them in
    RAM: a 1.42B GPT puts all its parameters on NVMe (measured on an H200: 25.50 GB written per step,
    0.004% from this), and a model under 1e9 elements none.
    """
    if p.strategy.offload_param != "nvme":
        return []
    partitions = [math.ceil(numel / world) for numel in shape.param_numels]
    room = max(1, min(sum(partitions), p.strategy.max_in_cpu))  # DeepSpeed's empty buffer has 1 element
    used, on_disk = 0, []
    for members in _sub_group_members(partitions, p.strategy.sub_group_size):
        group = sum(partitions[i] for i in members)
        if used + group > room:
            on_disk += members
        used += group
    return on_disk


def swap_buffer_bytes(p: Placement, shape: Shape, world: int, buffers: SwapBuffers | None) -> dict[str, list[float]]:
    """Bytes of each NVMe swap buffer of a rank, which DeepSpeed page-locks with mlock (its pin_memory op)
    whatever `pin_memory` says: the parameter swapper's buffer_count buffers of buffer_size, and the
    optimizer swapper's, each the largest sub-group's fp32 partition."""
    out: dict[str, list[float]] = {}
    if buffers is None:
        return out
    if p.strategy.offload_param == "nvme":
        out["parameter swap buffers"] = [buffers.param_buffer_size * shape.param_bytes] * buffers.param_buffer_count
    if p.strategy.offload_optimizer == "nvme":
        sub_group = max(sub_groups(shape, world, p.strategy.sub_group_size))
        out["optimizer swap buffers"] = [4 * sub_group] * buffers.optimizer_buffer_count
    return out


def pinned_swap_bytes(strategy: DeepSpeedStrategy, shape: Shape, world: int, buffers: SwapBuffers) -> float:
    """All of a rank's swap buffers, in bytes."""
    return sum(sum(sizes) for sizes in swap_buffer_bytes(Placement(strategy), shape, world, buffers).values())


def swapped_numels(shape: Shape, strategy: DeepSpeedStrategy, nproc: int, aio: AioSettings) -> list[int]:
    """Elements of each parameter DeepSpeed swaps through the buffers every step, in the model's order: those
    the max_in_cpu buffer has no room for (planner.params_swapped) whose rank's partition reaches the
    smallest aio transfer, max(1 MiB, the aio block size) (partitioned_param_swapper.swappable_tensor)."""
    min_bytes = max(MIN_SWAPPED_BYTES, aio.block_size)
    on_disk = [shape.param_numels[i] for i in params_swapped(Placement(strategy), shape, nproc)]
    return [n for n in on_disk if -(-n // nproc) * shape.param_bytes >= min_bytes]


def params_held_at_turn(swapped: list[int], strategy: DeepSpeedStrategy) -> int:
    """The fewest swap buffers a traced step needs: where forward turns into backward DeepSpeed still holds
    every parameter used again within stage3_max_reuse_distance elements, i.e. those within half of it of
    forward's end, and fetches the next one. (stage3_max_live_parameters and the prefetch bucket only limit
    prefetching, which waits for free buffers.) Measured on this machine's CPU with max_in_cpu = 0, 10 swapped
    parameters: a window over the whole model needs all 10 (9 stop), 3e5 elements run with one buffer;
    on an H200, the 1.42B GPT with DeepSpeed's 1e9 window stopped with 16 buffers (this asks 33)."""
    tail, held = 0, 0
    for numel in reversed(swapped):
        tail += numel
        if tail > strategy.stage3_max_reuse_distance // 2:
            break
        held += 1
    return min(held + 1, len(swapped)) if swapped else 1


def buffers_for(shape: Shape) -> SwapBuffers:
    """The parameter buffers a placement swapping its parameters needs at DeepSpeed's default windows: each
    widened to the largest parameter, and as many as it holds at the forward/backward turn (at least
    DeepSpeed's default 5); what `plan --write` writes for such a placement."""
    default = DeepSpeedStrategy(name="default", engine="deepspeed", offload_optimizer="nvme", offload_param="nvme")
    held = params_held_at_turn(swapped_numels(shape, default, 1, AioSettings()), default)
    return replace(
        SwapBuffers(),
        param_buffer_count=max(SwapBuffers().param_buffer_count, held),
        param_buffer_size=max(SwapBuffers().param_buffer_size, shape.largest_param_numel),
    )


def swap_buffers_of(strategy, shape: Shape) -> SwapBuffers:
    """The parameter swap buffers a strategy asks for when it swaps parameters to NVMe, else the ones
    buffers_for sizes."""
    if strategy is not None and strategy.swaps_parameters:
        return SwapBuffers.of(strategy)
    return buffers_for(shape)


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


def tuned_buffers(spec: RunSpec, strategy: DeepSpeedStrategy, aio: AioSettings) -> SwapBuffers:
    """Buffers and windows for the spec's model at the aio settings the run will use (the tune's fastest):
    windows of four blocks, so the prefetch stays ahead of compute without pinning the whole model, and as
    many buffers as the prefetch window holds parameters."""
    shape = shape_of_spec(spec)
    max_live = min(strategy.stage3_max_live_parameters, 4 * shape.block_params)
    swapped = swapped_numels(shape, strategy, spec.nproc, aio)
    return SwapBuffers(
        # Whole elements per thread-aligned chunk, as DeepSpeed rounds each buffer.
        param_buffer_size=_aligned(
            shape.largest_param_numel, ALIGNMENT * aio.intra_op_parallelism // shape.param_bytes
        ),
        param_buffer_count=max_params_in_window(swapped, max_live + strategy.stage3_prefetch_bucket_size)
        + SAFETY_BUFFERS,
        optimizer_buffer_count=strategy.optimizer_buffer_count,
        stage3_max_live_parameters=max_live,
        stage3_max_reuse_distance=max_live,
    )
