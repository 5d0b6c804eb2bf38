"""The torchao placement the planner proposes: CPUOffloadOptimizer with DeepSpeed's CPU Adam, on one GPU."""

from __future__ import annotations

from offloadlab.plan.accounting import Placement, Shape
from offloadlab.spec import TorchAOStrategy


def candidates() -> list[Placement]:
    return [Placement(TorchAOStrategy(name="torchao-cpu-offload", engine="torchao"))]


def when_host_ram_binds(p: Placement) -> list[Placement]:
    return []


def partial_offloads(p: Placement, shape: Shape, world: int, spare_gpu_bytes: float) -> list[Placement]:
    return []


def inexact_options(p: Placement, precision: str, on_cuda: bool, grad_accum: int) -> list[Placement]:
    return []
