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
    return []


def inexact_options(p: Placement, precision: str, on_cuda: bool, grad_accum: int) -> list[Placement]:
    return []
