"""The FSDP2 placements the planner proposes: without offload, and with CPUOffloadPolicy (torch's AdamW or
DeepSpeed's CPU Adam on the shards)."""

from __future__ import annotations

from offloadlab.plan.accounting import Placement, Shape
from offloadlab.spec import FSDP2Strategy


def candidates() -> list[Placement]:
    return [
        Placement(FSDP2Strategy(name="fsdp2", engine="fsdp2")),
        Placement(FSDP2Strategy(name="fsdp2-cpu-offload", engine="fsdp2", cpu_offload=True)),
        Placement(
            FSDP2Strategy(name="fsdp2-cpu-offload-dsadam", engine="fsdp2", cpu_offload=True, cpu_optimizer="deepspeed")
        ),
    ]


def when_host_ram_binds(p: Placement) -> list[Placement]:
    return []


def partial_offloads(p: Placement, shape: Shape, world: int, spare_gpu_bytes: float) -> list[Placement]:
    """With CPU offload and room on the GPU: every block kept gathered from its forward to its backward
    (reshard_after_forward=False) and, with accumulation, from one micro-batch to the next, so each fp32
    shard is uploaded once a step, not twice a micro-batch (1.42B GPT on an H100: 1.223 s a step against
    1.295, bench/results/2026-12-06-gpu-s25). The planner checks the room."""
    if not p.strategy.cpu_offload or not p.strategy.reshard_after_forward:
        return []
    return [p.varied(f"{p.strategy.name}-kept", reshard_after_forward=False)]


def inexact_options(p: Placement, precision: str, on_cuda: bool, grad_accum: int) -> list[Placement]:
    return []
