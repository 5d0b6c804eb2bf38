"""The torchao placements the planner proposes: CPUOffloadOptimizer with DeepSpeed's CPU Adam, on one GPU,
its bf16-master variant, and both with part of the optimizer on the GPU where it has room."""

from __future__ import annotations

from offloadlab.engines.torchao.planner import state_bytes
from offloadlab.plan.accounting import Placement, Shape
from offloadlab.spec import TorchAOStrategy


def candidates() -> list[Placement]:
    return [Placement(TorchAOStrategy(name="torchao-cpu-offload", engine="torchao"))]


def when_host_ram_binds(p: Placement) -> list[Placement]:
    return []


def partial_offloads(p: Placement, shape: Shape, world: int, spare_gpu_bytes: float) -> list[Placement]:
    """The ratios whose GPU-kept Adam moments fit the GPU's spare bytes, smallest first (the plan keeps the
    first that fits): the GPU steps the rest beside the CPU's steps."""
    if p.strategy.ratio < 1 or p.activation_checkpointing:
        return []
    moment_bytes = 2 * state_bytes(p.strategy) * shape.n_params
    return p.with_ratios(p.name, spare_gpu_bytes, moment_bytes)


def inexact_options(p: Placement, precision: str, on_cuda: bool, grad_accum: int) -> list[Placement]:
    """bf16 master weights and moments, for bf16 runs."""
    if precision != "bf16" or p.strategy.bf16_master_weights:
        return []
    return [p.varied(f"{p.name}-bf16master", bf16_master_weights=True)]
