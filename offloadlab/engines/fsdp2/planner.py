"""The planner's model of FSDP2 (`fully_shard`), with and without CPUOffloadPolicy."""

from __future__ import annotations

import math

from offloadlab.plan.accounting import Links, Memory, Placement, Shape, pinned_if_asked
from offloadlab.spec import FSDP2Strategy

# FSDP2's forward over the same model's without it (ZeRO-2, parameters on the GPU), 1.42B GPT (24 blocks and
# the root), one micro-batch, on two 16-core H200 hosts: 0.035 against 0.018 s; forward and backward
# together 0.034 s over the block-rate compute, about 1.4 ms a unit. Host (Python) time, as ZeRO-3's hooks.
FSDP2_HOOK_S_PER_UNIT = 1.4e-3

# FSDP2's optimizer phase with the shards on the CPU (clipping, then Adam), measured over what the link probes
# predict for it (Adam and one host pass at their probed rates), on two 16-core H200 hosts (B: session 12,
# C: session 15): DeepSpeed's CPU Adam 2.14 and 2.11 (B, 1.42B), 2.00 (C, 1.42B), 1.96 (C, 7.67B); torch's
# AdamW 1.71 (B) and 1.40 (C). The same step over plain CPU memory (the 2-core CI machine, FSDP2 on gloo) runs
# at the probes' rates, so the gap comes with the GPU host; that it is the pinned shards' pages (4 KiB where
# the probes' memory gets huge pages) is a guess not yet measured.
FSDP2_CPU_STEP_OVER_PROBES = {"deepspeed": 2.05, "torch": 1.55}


def pinned_buffers(p: Placement, shape: Shape, world: int, buffers: object | None) -> list[float]:
    """CPUOffloadPolicy pins each parameter's fp32 shard and its gradient's, one buffer each (with its
    pin_memory)."""
    if not (p.strategy.cpu_offload and p.strategy.pin_memory):
        return []
    return [4 * math.ceil(numel / world) for numel in shape.param_numels for _ in range(2)]


def adamw_temporary_numel(p: Placement, shape: Shape, on_gpu: bool) -> int:
    """Elements of fp32 the optimizer allocates in its step beyond its states. torch's AdamW on a GPU
    (foreach) makes `_foreach_sqrt` of all v at once; on the CPU it loops over tensors, and each tensor's
    `exp_avg_sq.sqrt() / bias_correction2_sqrt` holds two copies of it at once: twice the largest tensor
    (H200, 7.46B and 7.67B GPT under CPUOffloadPolicy: 1.52 and 1.41 GiB more host RSS than with DeepSpeed's
    CPU Adam, 1.54 predicted). DeepSpeed's CPU Adam updates in place."""
    if p.strategy.cpu_optimizer == "deepspeed":
        return 0
    if on_gpu and not p.strategy.cpu_offload:
        return shape.n_params
    return 2 * shape.largest_param_numel


def memory(p: Placement, shape: Shape, world: int, buffers: object | None, on_gpu: bool) -> Memory:
    """fp32 shards of the parameters and of Adam's m and v, held; the fp32 gradient shards exist from the
    last micro-batch's backward to zero_grad. Without offload the peak is that step (H200, 1.42B: 26.46 GiB
    measured, 20 bytes a parameter = 26.45 GiB), with CPUOffloadPolicy it is the turn."""
    m, n = Memory(), shape.n_params
    temporary = 4 * adamw_temporary_numel(p, shape, on_gpu) / world
    if p.strategy.cpu_offload:
        m.add(pinned_if_asked(p.strategy), "parameters + gradients (fp32 shards)", 8 * n / world)
        m.add("host_pageable", "optimizer states", 8 * n / world)
        if temporary:
            m.add("host_pageable", "AdamW's temporaries", temporary)
    else:
        m.add("gpu", "parameters + optimizer states (fp32 shards)", 12 * n / world)
        m.add("gpu_step", "gradients (fp32 shards)", 4 * n / world)
        m.add("gpu_step", "AdamW's temporaries", temporary)
    if shape.grad_accum > 1:
        # Without gradient sync (all micro-batches but the last) FSDP2 accumulates unsharded gradients in
        # the reduce dtype (fp32) on the device (FSDPParam.unsharded_accumulated_grad).
        m.add("gpu_turn", "gradients accumulated unsharded (fp32)", 4 * n)
    # One block gathered in the compute precision; the root's embeddings and head stay gathered
    # (reshard_after_forward=False on the root) until backward ends. The turn's peak comes before any
    # unsharded gradient exists; a block's appears once its larger activations are freed (H200, 1.42B,
    # CPUOffloadPolicy: 8.79 GiB measured, 8.77 predicted this way).
    if p.strategy.reshard_after_forward:
        m.add("gpu_turn", "gathered block + root", shape.param_bytes * (shape.block_params + shape.root_params))
    else:  # every block stays gathered from its forward until its backward
        m.add("gpu_turn", "gathered model", shape.param_bytes * shape.n_params)
    m.host_build_bytes = 4 * shape.n_params  # built in fp32 on the CPU, freed once sharded
    return m


def step_bytes(p: Placement, shape: Shape, world: int) -> dict[str, float]:
    """Bytes per optimizer step over each link: PCIe (per rank); FSDP2 never touches NVMe."""
    out = {"nvme_read": 0.0, "nvme_write": 0.0, "pcie_h2d": 0.0, "pcie_d2h": 0.0}
    if p.strategy.cpu_offload:
        # The fp32 shards go up for forward and again for backward in each micro-batch, unless the blocks
        # stay gathered: then once a step (the engine keeps them gathered across micro-batches too).
        uploads = 2 * shape.grad_accum if p.strategy.reshard_after_forward else 1
        out["pcie_h2d"] = uploads * 4 * shape.n_params / world
        out["pcie_d2h"] = (
            4 * shape.n_params / world
        )  # the reduced gradient, once a step (sync on the last micro-batch)
    return out


def param_upload_bytes(p: Placement, shape: Shape, world: int) -> float:
    return 0.0


def param_nvme_read_bytes(p: Placement, shape: Shape, world: int) -> float:
    return 0.0


def optimizer_phase(
    p: Placement, shape: Shape, world: int, links: Links, swap_read: float, swap_write: float
) -> dict[str, float]:
    """torch's or DeepSpeed's AdamW on the CPU shards with clipping's host pass, at the probes' rates slowed
    as measured (FSDP2_CPU_STEP_OVER_PROBES), or torch's on the device."""
    on_rank = shape.n_params / world
    if p.strategy.cpu_offload:
        deepspeed = p.strategy.cpu_optimizer == "deepspeed"
        adam_rate = links.cpu_adam_params_per_s if deepspeed else links.torch_cpu_adam_params_per_s
        slower = FSDP2_CPU_STEP_OVER_PROBES[p.strategy.cpu_optimizer]
        return {
            "cpu_adam": slower * on_rank / adam_rate,
            "host_passes": slower * on_rank / links.host_passes_params_per_s,
        }
    return {"device_adam": on_rank / links.device_adam_params_per_s} if links.device_adam_params_per_s else {}


def serial_in_training(p: Placement, shape: Shape, world: int, links: Links) -> dict[str, float]:
    """Host work forward and backward wait on: FSDP2's hooks, per sharded unit (each block and the root) and
    micro-batch (FSDP2_HOOK_S_PER_UNIT). CPUOffloadPolicy's gradient copies to the host are asynchronous:
    a PCIe part, not here."""
    return {"fsdp2_hooks": shape.grad_accum * (shape.n_layers + 1) * FSDP2_HOOK_S_PER_UNIT}


def overlapped_with_training(p: Placement) -> tuple[str, ...]:
    return ()


def checkpoint_bytes(strategy: FSDP2Strategy, n_params: int, param_bytes: int) -> int:
    """fp32 weights and both Adam moments: 12 bytes a parameter (measured on FSDP2 checkpoints)."""
    return 12 * n_params


def swap_bytes(strategy: FSDP2Strategy, n_params: int, param_bytes: int) -> int:
    return 0  # nothing on NVMe
