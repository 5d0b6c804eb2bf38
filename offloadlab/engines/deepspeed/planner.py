"""The planner's model of DeepSpeed ZeRO 1/2/3 with optimizer and parameter offload (ZeRO-Infinity).

Model states follow the ZeRO paper's accounting, in the precisions the two engines really keep:
- DeepSpeed, bf16: 16-bit parameters and gradients (2 + 2 bytes), and for the optimizer an fp32 master,
  an fp32 gradient partition and Adam's m and v (4 + 4 + 8). fp32: 4-byte parameters and gradients,
  Adam 8, no master copy; with bf16_master_weights the four optimizer states are bf16 (8 bytes).
  ZeRO-1 partitions the optimizer, ZeRO-2 also the gradients, ZeRO-3 also the parameters; ZeRO-3
  additionally holds the layer being gathered (16-bit parameter + gradient, DeepSpeed's own
  `largest_layer_memory`).
- FSDP2: fp32 sharded parameters and gradients (reduce in fp32) and Adam m, v on the shard: 16 bytes a
  parameter / N, plus the 16-bit copy of the block being gathered (MixedPrecisionPolicy). The gradients
  exist only from backward to zero_grad, so the GPU peaks either at the forward/backward turn (activations)
  or in the optimizer step (gradients and AdamW's foreach temporary): `Memory.gpu_turn` / `gpu_step`.
`tests/test_plan.py` checks these against DeepSpeed's `estimate_zero2/zero3_model_states_mem_needs`.
DeepSpeed's GPU also holds its gradient reduce buckets (1 GB for ZeRO-3 in bf16, 2 GB for ZeRO-1/2), which
its estimators leave out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from offloadlab.engines.deepspeed.buffers import SwapBuffers, params_swapped, sub_groups, swap_buffer_bytes
from offloadlab.plan.accounting import Links, Memory, Placement, Shape, loss_bytes, pinned_if_asked
from offloadlab.spec import DeepSpeedStrategy, ZenFlowSettings

# DeepSpeed's default reduce_bucket_size (offloadlab leaves it alone), in elements of the model's dtype.
DEEPSPEED_REDUCE_BUCKET_SIZE = 500_000_000
# ZeRO-3's forward + backward over ZeRO-2's, both with the parameters on the GPU and the optimizer on the
# CPU, 1.42B GPT (293 parameter tensors), one micro-batch, on two 16-core H200 hosts: 0.13-0.16 s, about
# 0.5 ms a parameter tensor (0.64 ms with the parameters on the CPU). Host (Python) time: a slower host
# takes longer.
ZERO3_HOOK_S_PER_TENSOR = 0.5e-3


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per parameter of each model state DeepSpeed keeps."""

    param: int
    """The model's dtype: 2 for bf16, 4 for fp32."""
    grad: int
    master: int = 4
    """The optimizer's master partition, its gradient partition and each of Adam's m and v: fp32 (DeepSpeed
    keeps them in fp32 training too), or bf16 with bf16_master_weights."""

    @property
    def optimizer(self) -> int:
        return 4 * self.master

    @classmethod
    def deepspeed(cls, param_bytes: int, bf16_master_weights: bool = False) -> "ModelStateBytes":
        return cls(param=param_bytes, grad=param_bytes, master=2 if bf16_master_weights else 4)

    @classmethod
    def of(cls, p: Placement, shape: Shape) -> "ModelStateBytes":
        """What a placement's strategy keeps, in the model's dtype."""
        return cls.deepspeed(shape.param_bytes, p.strategy.bf16_master_weights)


def _place_of(device: str) -> str:
    return {"none": "gpu", "cpu": "host_pinned", "nvme": "nvme"}[device]


def host_optimizer_share(p: Placement, shape: Shape, world: int) -> float:
    """The share of a rank's optimizer DeepSpeed keeps and updates off the GPU. With ratio < 1 it assigns
    whole sub-groups: sub-group i goes to the CPU when i >= int((1 - ratio) * count) (stage3's
    subgroup_to_device), so the share is coarser than the ratio (an 8B GPT's 8 sub-groups at ratio 0.3
    put 3 of 8 on the CPU)."""
    if p.strategy.offload_optimizer == "none":
        return 0.0
    if p.strategy.ratio >= 1.0 or p.strategy.zero_stage != 3:
        return 1.0
    return sum(host_sub_groups(p, shape, world)) / sum(sub_groups(shape, world, p.strategy.sub_group_size))


def host_optimizer_params(p: Placement, shape: Shape, world: int) -> float:
    """The parameters a rank's optimizer updates off the GPU (its host share of the rank's partition)."""
    return host_optimizer_share(p, shape, world) * shape.n_params / world


def host_sub_groups(p: Placement, shape: Shape, world: int) -> list[int]:
    """The ZeRO-3 sub-groups whose optimizer is off the GPU, in elements."""
    groups = sub_groups(shape, world, p.strategy.sub_group_size)
    return groups[int((1 - min(p.strategy.ratio, 1.0)) * len(groups)) :]


def params_kept_at_turn(p: Placement, shape: Shape) -> float:
    """Gathered parameter elements ZeRO-3 keeps from the end of forward into backward: a module's
    parameters are not released when they are used again within stage3_max_reuse_distance elements
    (partitioned_param_coordinator.__params_to_release), and at most stage3_max_live_parameters are live.
    They sit on the GPU at the activation peak and are not fetched again for backward. (H200, 1.42B: the
    NVMe run with both at 2e8 read 0.38 GB = 192M parameters less than two full fetches; the CPU-offload run
    with the defaults, 1e9, peaked 1.6 GiB above the same prediction without this term.)"""
    if p.strategy.zero_stage != 3:
        return 0.0
    return float(min(p.strategy.stage3_max_reuse_distance, p.strategy.stage3_max_live_parameters, shape.n_params))


def gathers_copies(p: Placement, world: int) -> bool:
    """Whether ZeRO-3 gathers a parameter into memory of its own. On one rank with the parameters on the
    GPU it does not: the partition is the whole parameter and DeepSpeed points the module at it
    (partition_parameters' NoGatherHandle; the H200's allocator history shows no gathered copies)."""
    return p.strategy.zero_stage == 3 and (world > 1 or p.strategy.offload_param != "none")


def params_on_nvme(p: Placement, shape: Shape, world: int) -> float:
    """Parameter elements DeepSpeed really keeps on NVMe, all ranks."""
    return world * sum(math.ceil(shape.param_numels[i] / world) for i in params_swapped(p, shape, world))


def model_states(p: Placement, shape: Shape, world: int) -> Memory:
    """Parameters, gradients and optimizer states of one rank (NVMe: of the host, all its ranks)."""
    m, n, b = Memory(), shape.n_params, ModelStateBytes.of(p, shape)
    params_here = n / world if p.strategy.zero_stage == 3 else n
    if p.strategy.offload_param == "nvme":
        m.add("host_pinned", "parameters (max_in_cpu)", b.param * min(params_here, p.strategy.max_in_cpu))
        m.add("nvme", "parameters", b.param * params_on_nvme(p, shape, world))
    else:
        m.add(_place_of(p.strategy.offload_param), "parameters", b.param * params_here)
    if gathers_copies(p, world):
        # The layer being gathered: its 16-bit parameters and their gradients (DeepSpeed's largest_layer_memory).
        m.add("gpu", "gathered layer", (b.param + b.grad) * shape.largest_param_numel)
        m.add("gpu", "parameters kept for reuse", b.param * params_kept_at_turn(p, shape))
    if p.strategy.zenflow is not None:
        # Fitted to the H200 (1.42B GPT, bf16, topk_ratio 0.1): ZenFlow's GPU-side selective AdamW added
        # 0.53 GiB (4 bytes a selected parameter: its 16-bit m and v), its CPU workers 21.7 GiB of host
        # RSS (16 bytes a parameter: their own fp32 copies) over ZeRO-2-cpu's.
        m.add("gpu", "ZenFlow's selective optimizer states", 4 * p.strategy.zenflow.topk_ratio * n / world)
        m.add("host_pageable", "ZenFlow's CPU workers", 16 * n / world)
    if p.strategy.zero_stage < 3 and p.strategy.offload_optimizer != "none":
        # Where ZeRO-1/2 stage a parameter's gradient on its way to and from the CPU
        # (stage_1_and_2's temp_grad_buffer_for_gpu_offload / _for_cpu_offload), held throughout.
        m.add("gpu", "gradient staging buffer", b.grad * shape.largest_param_numel)
        m.add(pinned_if_asked(p.strategy), "gradient staging buffer", b.grad * shape.largest_param_numel)
        # The stepped fp32 partition is cast into a 16-bit copy on the host before it goes back to the GPU
        # (stage_1_and_2's param_buffer_of_bit16_for_cpu_offload_groups), pinned for the whole run.
        m.add(pinned_if_asked(p.strategy), "16-bit copy of the partition", b.param * n / world)
    if p.strategy.offload_optimizer == "none" and p.strategy.zero_stage < 3:
        m.add("gpu", "gradients", b.grad * (n if p.strategy.zero_stage == 1 else n / world))
    # ZeRO-3 reduces gradients straight into the optimizer's fp32 partition, and with the optimizer
    # offloaded they stream to it as they are reduced: either way they are in `optimizer`.
    optimizer = b.optimizer * n / world
    if p.strategy.offload_optimizer == "none":
        m.add("gpu", "optimizer states", optimizer)
    else:
        # ratio < 1 keeps the rest on the GPU (DeepSpeed's partial optimizer offload), updated there by a
        # torch AdamW whose foreach step adds a temporary of one sub-group's fp32 size.
        share = host_optimizer_share(p, shape, world)
        if p.strategy.offload_optimizer == "nvme":
            m.add("nvme", "optimizer states", optimizer * share * world)
        else:
            # Pinned: the master gradient of each sub-group (stage3), or the master partition and its gradient
            # (stage_1_and_2), as pinned_buffers lists them; Adam's m and v are CPU Adam's own pageable state.
            pinned = (1 if p.strategy.zero_stage == 3 else 2) * b.master * share * n / world
            m.add(pinned_if_asked(p.strategy), "optimizer states", pinned)
            m.add("host_pageable", "optimizer states", optimizer * share - pinned)
        if share < 1.0:
            m.add("gpu", "optimizer states", optimizer * (1 - share))
            m.add(
                "gpu_step",
                "AdamW's temporary (one sub-group)",
                4 * max(sub_groups(shape, world, p.strategy.sub_group_size)),
            )
    return m


def reduce_bucket_bytes(p: Placement, shape: Shape, on_gpu: bool) -> float:
    """DeepSpeed's gradient reduce buckets on the device: one of reduce_bucket_size elements for ZeRO-3
    (stage3's ipg bucket), two for ZeRO-1/2 with overlap_comm (stage_1_and_2.setup_buckets), in the model's
    dtype. They are allocated whole, whatever the model's size; on a CPU device only the pages gradients pass
    through are resident."""
    count = 1 if p.strategy.zero_stage == 3 else 2
    elements = count * DEEPSPEED_REDUCE_BUCKET_SIZE
    allocated = shape.param_bytes * (elements if on_gpu else min(elements, shape.n_params))
    if p.strategy.zero_stage == 3:
        return allocated  # allocated at initialize, held throughout
    # ZeRO-1/2 allocate theirs at the first gradient and free them after the step (_release_ipg_buffers):
    # in backward, where the loss's logits are already freed, so only what exceeds those adds to the peak.
    return max(0.0, allocated - loss_bytes(shape))


def memory(p: Placement, shape: Shape, world: int, buffers: SwapBuffers | None, on_gpu: bool) -> Memory:
    """Model states, reduce buckets, pinned gradient and swap buffers of one rank (NVMe: of the host)."""
    m = model_states(p, shape, world)
    m.add("gpu", "gradient reduce buckets", reduce_bucket_bytes(p, shape, on_gpu))
    if p.strategy.zero_stage == 3 and p.strategy.offload_optimizer != "none":
        # ZeRO-3 reduces 16-bit gradients into a pinned buffer of the whole partition on the optimizer's
        # device, the CPU for either offload (stage3's grad_partitions_flat_buffer), which stays in RAM.
        m.add(
            pinned_if_asked(p.strategy),
            "gradient partitions (16-bit)",
            shape.param_bytes * math.ceil(shape.n_params / world),
        )
    # ZeRO-1/2 build the fp32 model on the CPU first; ZeRO-3's zero.Init partitions it at construction.
    m.host_build_bytes = 0 if p.strategy.zero_stage == 3 else 4 * shape.n_params
    for what, sizes in swap_buffer_bytes(p, shape, world, buffers).items():
        m.add("host_pinned", what, sum(sizes))
    return m


def pinned_buffers(p: Placement, shape: Shape, world: int, buffers: SwapBuffers | None) -> list[float]:
    """Bytes of each buffer DeepSpeed pins for a rank: with `pin_memory`, ZeRO-1/2's fp32 partition, its
    gradient and 16-bit copy (stage_1_and_2), ZeRO-3's fp32 gradient of each sub-group on the CPU and 16-bit
    gradient buffer (stage3); whatever it says, the parameters kept in RAM (stage3's flat buffer,
    _create_param_groups_fp16_flat_cpu_memory) and the swap buffers."""
    s, b, n = p.strategy, shape.param_bytes, shape.n_params
    master = ModelStateBytes.of(p, shape).master
    if_asked: list[float] = []
    if s.offload_optimizer == "cpu" and s.zero_stage < 3:
        if_asked += [master * n / world, master * n / world, b * n / world, b * shape.largest_param_numel]
    elif s.offload_optimizer == "cpu":
        if_asked += [master * g for g in host_sub_groups(p, shape, world)]
    if s.zero_stage == 3 and s.offload_optimizer != "none":
        if_asked.append(b * math.ceil(n / world))
    out = if_asked if s.pin_memory else []
    if s.offload_param == "cpu":
        out.append(b * n / world)
    if s.offload_param == "nvme":
        out.append(b * min(n / world, s.max_in_cpu))
    return out + [size for sizes in swap_buffer_bytes(p, shape, world, buffers).values() for size in sizes]


def step_bytes(p: Placement, shape: Shape, world: int) -> dict[str, float]:
    """Bytes per optimizer step over each link: NVMe (per host), PCIe (per rank)."""
    n, k, b = shape.n_params, shape.grad_accum, shape.param_bytes
    out = {"nvme_read": 0.0, "nvme_write": 0.0, "pcie_h2d": 0.0, "pcie_d2h": 0.0}
    if p.strategy.offload_param != "none":
        # Each micro-batch fetches every parameter for forward and again for backward, but those kept
        # across the turn.
        out["pcie_h2d"] += k * b * (2 * n - params_kept_at_turn(p, shape)) / world
        out["nvme_read"] += param_nvme_read_bytes(p, shape, world)
        out["nvme_write"] += b * params_on_nvme(p, shape, world)  # the updated 16-bit parameters
    if p.strategy.offload_optimizer != "none":
        # Gradients, every micro-batch: ZeRO-3 copies them 16-bit into a pinned buffer, ZeRO-1/2 convert
        # them to the master's dtype on the GPU first (async_inplace_copy_grad_to_fp32_buffer_from_gpu).
        grad_bytes = b if p.strategy.zero_stage == 3 else ModelStateBytes.of(p, shape).master
        share = host_optimizer_share(p, shape, world)
        out["pcie_d2h"] += k * grad_bytes * n / world * share
        out["pcie_h2d"] += param_upload_bytes(p, shape, world)
        if p.strategy.offload_optimizer == "nvme":
            swapped = optimizer_swap_bytes(p, shape, world) * share
            out["nvme_read"] += swapped
            out["nvme_write"] += swapped
    return out


def param_upload_bytes(p: Placement, shape: Shape, world: int) -> float:
    """The updated 16-bit parameters copied back to the GPU after a CPU or NVMe optimizer step, when the
    parameters live on the GPU (with ratio < 1, only the host's share)."""
    if p.strategy.offload_optimizer == "none" or p.strategy.offload_param != "none":
        return 0.0
    return shape.param_bytes * host_optimizer_params(p, shape, world)


def param_nvme_read_bytes(p: Placement, shape: Shape, world: int) -> float:
    """Parameters read from NVMe per step, all ranks: for forward and again for backward, every micro-batch,
    except those kept across the forward/backward turn."""
    on_nvme = params_on_nvme(p, shape, world)
    return shape.grad_accum * shape.param_bytes * (2 * on_nvme - min(params_kept_at_turn(p, shape), on_nvme))


def optimizer_swap_bytes(p: Placement, shape: Shape, world: int) -> float:
    """Bytes the NVMe optimizer swapper reads (and writes) per step, all ranks.

    DeepSpeed swaps a sub-group's fp32 master, m and v as flat tensors, and each parameter's fp32 gradient
    on its own, but only tensors of at least max(1 MiB, aio block_size) (optimizer_utils.is_swappable_tensor):
    smaller ones stay in memory.
    """
    min_bytes = max(1 << 20, p.strategy.aio.block_size)
    states = sum(12 * g for g in sub_groups(shape, world, p.strategy.sub_group_size) if 4 * g >= min_bytes)
    grads = sum(4 * numel / world for numel in shape.param_numels if 4 * numel / world >= min_bytes)
    return (states + grads) * world


def optimizer_phase(
    p: Placement, shape: Shape, world: int, links: Links, swap_read: float, swap_write: float
) -> dict[str, float]:
    """Seconds of each part of the optimizer step, by where the optimizer states live."""
    on_rank = shape.n_params / world
    if p.strategy.offload_optimizer == "none":
        return (
            {"device_adam": on_rank / links.device_fused_adam_params_per_s}
            if links.device_fused_adam_params_per_s
            else {}
        )
    on_host = host_optimizer_params(p, shape, world)
    on_device = on_rank - on_host
    # ZenFlow updates its top-k columns on the GPU every step and the rest on the CPU once every
    # update_interval steps: a step carries that share of the CPU's update and of the upload after it.
    every = 1
    if p.strategy.zenflow is not None:
        on_device = p.strategy.zenflow.topk_ratio * on_rank
        on_host = on_rank - on_device
        every = zenflow_update_interval(p.strategy.zenflow)
    out = {
        "cpu_adam": on_host / links.cpu_adam_params_per_s / every,
        "host_passes": on_host / links.host_passes_params_per_s / every,
    }
    if on_device and links.device_adam_params_per_s:
        # The GPU's sub-groups are updated in the same loop, one sub-group after another, by torch's AdamW.
        out["device_adam"] = on_device / links.device_adam_params_per_s
    if p.strategy.offload_optimizer == "nvme":
        out["nvme_optimizer"] = swap_read / links.nvme_read + swap_write / links.nvme_write
    upload = param_upload_bytes(p, shape, world)
    if upload and p.strategy.zero_stage == 3 and links.converting_upload_params_per_s:
        # stage3 uploads from the pageable fp32 partition, converting on the CPU (ZeRO-1/2 cast into a
        # pinned 16-bit buffer first and upload at the pinned rate).
        out["param_upload"] = upload / shape.param_bytes / links.converting_upload_params_per_s / every
    elif upload and links.pcie_h2d:
        out["param_upload"] = upload / links.pcie_h2d / every
    return out


def zenflow_update_interval(zenflow: ZenFlowSettings) -> int:
    """Steps between ZenFlow's CPU updates; "auto" adapts at run time, so a bound takes every step."""
    return zenflow.update_interval if isinstance(zenflow.update_interval, int) else 1


def serial_in_training(p: Placement, shape: Shape, world: int, links: Links) -> dict[str, float]:
    """Host work each micro-batch's forward and backward wait on, after what overlaps in them.
    - The gradient hand-off: with the optimizer offloaded, every gradient is handed to the CPU and cast into
      (ZeRO-1/2: accumulated in) its fp32 buffer there, inside the backward hooks: one host pass. On the
      H200 hosts ZeRO-2's backward took 0.17 s more than FSDP2's at 1.42B; the pass predicts 0.19 s.
    - ZeRO-3's hooks: its per-module fetch/release and per-parameter gradient hooks (ZERO3_HOOK_S_PER_TENSOR),
      whether the parameters live on the GPU or the CPU.
    Both from the stored 1.42B runs' phases (bench/results/2026-12-04-cpu-s14)."""
    out = {}
    if p.strategy.offload_optimizer != "none":
        out["grad_handoff"] = (
            shape.grad_accum * host_optimizer_params(p, shape, world) / links.host_passes_params_per_s
        )
    if p.strategy.zero_stage == 3:
        out["zero3_hooks"] = shape.grad_accum * len(shape.param_numels) * ZERO3_HOOK_S_PER_TENSOR
    return out


def overlapped_with_training(p: Placement) -> tuple[str, ...]:
    """The optimizer parts that run while the next steps' forward and backward do: ZenFlow's CPU update
    with overlap_step. SuperOffload's overlap is not counted: it steps the CPU's sub-groups before the
    gradient norm is known and steps again after a rollback when clipping (always on here) cuts in, and on
    the H200 it ran slower than ZeRO-3 with the optimizer on the CPU (bench/results/2026-12-04-h200-s11)."""
    if p.strategy.zenflow is not None and p.strategy.zenflow.overlap_step:
        return ("cpu_adam", "host_passes")
    return ()


# Bytes per parameter DeepSpeed keeps in the NVMe swap folder: fp32 master, Adam m and v, fp32 gradient.
OPTIMIZER_SWAP_BYTES_PER_PARAM = 16


def checkpoint_bytes(strategy: DeepSpeedStrategy, n_params: int, param_bytes: int) -> int:
    """fp32 weights and both Adam moments (12 bytes a parameter; measured on ZeRO-3 NVMe and CPU
    checkpoints), ZeRO-1/2 add the low-precision module copy; the restore check saves the restored
    state once more beside the checkpoint, so the peak is two copies."""
    return 2 * n_params * (12 + (param_bytes if strategy.zero_stage < 3 else 0))


def swap_bytes(strategy: DeepSpeedStrategy, n_params: int, param_bytes: int) -> int:
    """The ranks' partitions add up to the whole model: 16-bit parameters, and the optimizer's fp32 states."""
    total = n_params * param_bytes if strategy.offload_param == "nvme" else 0
    if strategy.offload_optimizer == "nvme":
        total += n_params * OPTIMIZER_SWAP_BYTES_PER_PARAM
    return total
