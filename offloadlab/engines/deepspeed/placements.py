"""The DeepSpeed placements the planner proposes, and the variants it weighs where one does not fit."""

from __future__ import annotations

from offloadlab.engines.deepspeed.planner import ModelStateBytes, host_optimizer_share
from offloadlab.plan.accounting import Placement, Shape
from offloadlab.spec import DeepSpeedStrategy, ZenFlowSettings


def _zero(name: str, stage: int, optimizer: str = "none", param: str = "none") -> Placement:
    return Placement(
        DeepSpeedStrategy(
            name=name, engine="deepspeed", zero_stage=stage, offload_optimizer=optimizer, offload_param=param
        )
    )


def candidates() -> list[Placement]:
    """Every exact ZeRO placement: 1/2/3 x none/cpu/nvme where DeepSpeed allows it. ZenFlow and SuperOffload
    are weighed when a spec names them, not proposed: ZenFlow is not exact AdamW, and neither beat
    ZeRO-2-cpu on the H200 (bench/results)."""
    out = [_zero("zero1", 1), _zero("zero1-cpu", 1, "cpu"), _zero("zero2", 2), _zero("zero2-cpu", 2, "cpu")]
    for optimizer in ("none", "cpu", "nvme"):
        for param in ("none", "cpu", "nvme"):
            if optimizer == "none" and param != "none":
                continue  # DeepSpeed offloads parameters only together with the optimizer
            suffix = (
                ""
                if optimizer == param == "none"
                else f"-opt-{optimizer}" + ("" if param == "none" else f"-param-{param}")
            )
            out.append(_zero(f"zero3{suffix}", 3, optimizer, param))
    return out


def when_host_ram_binds(p: Placement) -> list[Placement]:
    """DeepSpeed keeps up to max_in_cpu parameter elements pinned in RAM even "on NVMe": put them all there."""
    return [p.varied(f"{p.name}-max_in_cpu0", max_in_cpu=0)] if p.strategy.offload_param == "nvme" else []


def partial_offloads(p: Placement, shape: Shape, world: int, spare_gpu_bytes: float) -> list[Placement]:
    """ZeRO-3 with the optimizer on the CPU, but only the share (ratio) that does not fit in the GPU's spare
    bytes: the candidate ratios, smallest first. DeepSpeed moves whole sub-groups (host_optimizer_share), so
    the first tenth that covers the need may still keep too much on the GPU: the next ones up follow."""
    if (
        p.strategy.zero_stage != 3
        or p.strategy.offload_optimizer != "cpu"
        or p.strategy.offload_param != "none"
        or p.activation_checkpointing
    ):
        return []
    optimizer_bytes = ModelStateBytes.deepspeed(shape.param_bytes).optimizer * shape.n_params / world
    ratios = p.with_ratios("zero3-opt-cpu", spare_gpu_bytes, optimizer_bytes)
    # A model of one sub-group keeps none of it on the GPU at any ratio: such a row repeated zero3-opt-cpu.
    return [r for r in ratios if host_optimizer_share(r, shape, world) < 1]


# What hid ZenFlow's CPU update on a 1.42B GPT with 16 cores (bench/results/2026-12-05-h200-s21): automatic
# column selection (re-selecting every 4th step made each a 3 s step) and a CPU update every 16th step
# (every 4th waited 0.9-1.9 s for it).
ZENFLOW_MEASURED_BEST = ZenFlowSettings(topk_ratio=0.1, update_interval=16, overlap_step=True)


def inexact_options(p: Placement, precision: str, on_cuda: bool, grad_accum: int) -> list[Placement]:
    """For a placement whose optimizer steps on the CPU: bf16 master weights and optimizer states (bf16
    runs), and ZenFlow at ZeRO-1/2 (it needs CUDA, and takes over gradient accumulation)."""
    s = p.strategy
    if s.offload_optimizer != "cpu" or s.offload_param != "none" or not s.exact:
        return []
    out = []
    if precision == "bf16":
        out.append(p.varied(f"{p.name}-bf16master", bf16_master_weights=True))
    if on_cuda and s.zero_stage < 3 and grad_accum == 1:
        out.append(p.varied(f"{p.name}-zenflow", zenflow=ZENFLOW_MEASURED_BEST))
    return out
