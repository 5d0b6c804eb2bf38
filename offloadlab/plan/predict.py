"""`offloadlab plan`: predicted memory per rank and a step-time lower bound for every placement.

Model states follow the ZeRO paper's accounting, in the precisions the two engines really keep:
- DeepSpeed, bf16: 16-bit parameters and gradients (2 + 2 bytes), and for the optimizer an fp32 master,
  an fp32 gradient partition and Adam's m and v (4 + 4 + 8). fp32: 4-byte parameters and gradients,
  Adam 8, no master copy. ZeRO-1 partitions the optimizer, ZeRO-2 also the gradients, ZeRO-3 also the
  parameters; ZeRO-3 additionally holds the layer being gathered (16-bit parameter + gradient, DeepSpeed's
  own `largest_layer_memory`).
- FSDP2: fp32 sharded parameters and gradients (reduce in fp32) and Adam m, v on the shard: 16 bytes a
  parameter / N, plus the 16-bit copy of the block being gathered (MixedPrecisionPolicy). The gradients
  exist only from backward to zero_grad, so the GPU peaks either at the forward/backward turn (activations)
  or in the optimizer step (gradients and AdamW's foreach temporary): `Memory.gpu_turn` / `gpu_step`.
`tests/test_plan.py` checks these against DeepSpeed's `estimate_zero2/zero3_model_states_mem_needs`.
DeepSpeed's GPU also holds its gradient reduce buckets (1 GB for ZeRO-3 in bf16, 2 GB for ZeRO-1/2), which
its estimators leave out.

Activations per block and token (16-bit, flash/efficient attention, so no seq^2 term), what autograd
saves in `model.Block`: the two LayerNorms' inputs and the QKV input (d each), the QKV output that attention
keeps as q, k, v (3d), attention's output and the contiguous copy the projection takes (d + d), the first
MLP matmul's input (d), the GELU's input and the second matmul's input (4d + 4d): 17 elements x d_model.
With activation checkpointing only the block's input is kept, plus one block's worth while recomputing.
The loss adds the logits (16-bit) and their fp32 copy and gradient, per micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from offloadlab.results.figures import flops_per_token
from offloadlab.workload.model import GPTConfig

GiB = 1 << 30
# Resident host bytes of a training process before any model state (Python, torch, the runtime);
# a tiny CPU run's whole RSS is 340-420 MiB.
HOST_BASELINE_BYTES = 512 << 20
# DeepSpeed's NVMe optimizer swapper keeps this many fp32 sub-group buffers pinned (optimizer_buffer_count
# in the config is their number); their size is the largest sub-group (see deepspeed_sub_groups).
DEEPSPEED_SUB_GROUP_SIZE = 1_000_000_000
# DeepSpeed's default reduce_bucket_size (offloadlab leaves it alone), in elements of the model's dtype.
DEEPSPEED_REDUCE_BUCKET_SIZE = 500_000_000
# The share of a GPU's memory a plan may fill with what it predicts: the rest is left to the CUDA context
# and the caching allocator's fragmentation (reserved ran 5-60% above allocated in the H200 runs).
GPU_USABLE_SHARE = 0.9


@dataclass(frozen=True)
class Shape:
    """What the planner needs of a model and its batch."""

    n_layers: int
    d_model: int
    vocab_size: int
    seq_len: int
    micro_batch: int
    grad_accum: int
    param_bytes: int
    """2 for bf16, 4 for fp32."""
    param_numels: tuple[int, ...]
    """Elements of each parameter tensor, as the model builds them."""

    @classmethod
    def of(cls, cfg: GPTConfig, seq_len: int, micro_batch: int, grad_accum: int, precision: str) -> "Shape":
        cfg = replace(cfg, max_seq_len=seq_len)  # the position table is built for the run's sequence length
        return cls(cfg.n_layers, cfg.d_model, cfg.vocab_size, seq_len, micro_batch, grad_accum,
                   2 if precision == "bf16" else 4, tuple(cfg.param_numels()))

    @property
    def n_params(self) -> int:
        return sum(self.param_numels)

    @property
    def largest_param_numel(self) -> int:
        return max(self.param_numels)

    @property
    def block_params(self) -> int:
        return (self.n_params - 2 * self.vocab_size * self.d_model) // max(1, self.n_layers)


@dataclass(frozen=True)
class Placement:
    name: str
    engine: str
    zero_stage: int = 3
    offload_optimizer: str = "none"
    offload_param: str = "none"
    cpu_offload: bool = False
    """FSDP2's CPUOffloadPolicy."""
    ratio: float = 1.0
    """DeepSpeed's partial optimizer offload: the share of optimizer states on the CPU."""
    activation_checkpointing: bool = False
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_max_reuse_distance: int = 1_000_000_000
    max_in_cpu: int = 1_000_000_000
    """DeepSpeed keeps up to this many parameter elements (per rank) in pinned CPU memory even with
    offload_param = "nvme"; only the rest is read from NVMe."""
    aio_block_size: int = 1 << 20

    @property
    def uses_nvme(self) -> bool:
        return "nvme" in (self.offload_param, self.offload_optimizer)

    @classmethod
    def from_strategy(cls, strategy, activation_checkpointing: bool) -> "Placement":
        """The placement of a run spec's strategy (the inverse of `strategy()`)."""
        if strategy.engine == "deepspeed":
            return cls(strategy.name, "deepspeed", strategy.zero_stage, strategy.offload_optimizer, strategy.offload_param,
                       ratio=strategy.ratio, activation_checkpointing=activation_checkpointing,
                       stage3_max_live_parameters=strategy.stage3_max_live_parameters,
                       stage3_max_reuse_distance=strategy.stage3_max_reuse_distance,
                       max_in_cpu=strategy.max_in_cpu, aio_block_size=strategy.aio.block_size)
        return cls(strategy.name, "fsdp2", cpu_offload=strategy.cpu_offload, activation_checkpointing=activation_checkpointing)

    def strategy(self) -> dict:
        """The `[[strategy]]` table of a run spec for this placement."""
        if self.engine == "fsdp2":
            return {"name": self.name, "engine": "fsdp2", "cpu_offload": self.cpu_offload}
        out = {"name": self.name, "engine": "deepspeed", "zero_stage": self.zero_stage,
               "offload_optimizer": self.offload_optimizer, "offload_param": self.offload_param}
        if self.ratio < 1.0:
            out["ratio"] = self.ratio
        if self.offload_param == "nvme" and self.max_in_cpu != Placement.max_in_cpu:
            out["max_in_cpu"] = self.max_in_cpu
        return out


def candidate_placements() -> list[Placement]:
    """Every placement offloadlab can run: ZeRO 1/2/3 x none/cpu/nvme where DeepSpeed allows it, FSDP2 +- offload."""
    out = [Placement("zero1", "deepspeed", 1), Placement("zero1-cpu", "deepspeed", 1, "cpu"),
           Placement("zero2", "deepspeed", 2), Placement("zero2-cpu", "deepspeed", 2, "cpu")]
    for optimizer in ("none", "cpu", "nvme"):
        for param in ("none", "cpu", "nvme"):
            if optimizer == "none" and param != "none":
                continue  # DeepSpeed offloads parameters only together with the optimizer
            suffix = "" if optimizer == param == "none" else f"-opt-{optimizer}" + ("" if param == "none" else f"-param-{param}")
            out.append(Placement(f"zero3{suffix}", "deepspeed", 3, optimizer, param))
    out += [Placement("fsdp2", "fsdp2"), Placement("fsdp2-cpu-offload", "fsdp2", cpu_offload=True)]
    return out


@dataclass
class Memory:
    """Bytes per rank by place and purpose (NVMe and host totals are per host: all its ranks)."""

    gpu: dict[str, float] = field(default_factory=dict)
    """Held through the step."""
    gpu_turn: dict[str, float] = field(default_factory=dict)
    """Only around the forward/backward turn: activations, what is gathered for compute."""
    gpu_step: dict[str, float] = field(default_factory=dict)
    """Only in the optimizer step, after the activations are freed: gradients the step then drops
    (zero_grad(set_to_none=True)) and the optimizer's temporaries."""
    host_pinned: dict[str, float] = field(default_factory=dict)
    host_pageable: dict[str, float] = field(default_factory=dict)
    nvme: dict[str, float] = field(default_factory=dict)
    host_build_bytes: float = 0.0
    """The fp32 model a rank builds on the CPU before the engine takes it: freed before training states
    are allocated, so the host peak is the larger of the two phases, not their sum."""

    def add(self, place: str, what: str, nbytes: float) -> None:
        if nbytes:
            target = getattr(self, place)
            target[what] = target.get(what, 0.0) + nbytes

    @property
    def gpu_bytes(self) -> float:
        """The peak: what is held, plus the larger of the turn's and the optimizer step's own bytes."""
        return sum(self.gpu.values()) + max(sum(self.gpu_turn.values()), sum(self.gpu_step.values()))

    @property
    def host_state_bytes(self) -> float:
        return sum(self.host_pinned.values()) + sum(self.host_pageable.values())

    @property
    def host_bytes(self) -> float:
        """Peak host bytes of the rank: runtime plus the larger of the build copy and the training states."""
        return HOST_BASELINE_BYTES + max(self.host_build_bytes, self.host_state_bytes)

    @property
    def pinned_bytes(self) -> float:
        return sum(self.host_pinned.values())

    @property
    def nvme_bytes(self) -> float:
        return sum(self.nvme.values())


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per parameter of each model state DeepSpeed keeps."""

    param: int
    """The model's dtype: 2 for bf16, 4 for fp32."""
    grad: int
    optimizer: int = 16
    """fp32 master partition, fp32 gradient partition, Adam m and v (DeepSpeed keeps the fp32 copies in
    fp32 training too)."""

    @classmethod
    def deepspeed(cls, param_bytes: int) -> "ModelStateBytes":
        return cls(param=param_bytes, grad=param_bytes)


def _place_of(device: str) -> str:
    return {"none": "gpu", "cpu": "host_pinned", "nvme": "nvme"}[device]


def deepspeed_sub_groups(shape: Shape, world: int) -> list[int]:
    """A rank's ZeRO-3 sub-groups in elements, as DeepSpeed forms them (stage3._create_fp16_sub_groups):
    parameter partitions, in the model's order, collected until a group reaches sub_group_size."""
    partitions = [math.ceil(numel / world) for numel in shape.param_numels]
    if sum(partitions) <= DEEPSPEED_SUB_GROUP_SIZE:
        return [sum(partitions)]
    groups, current = [], 0
    for numel in partitions:
        current += numel
        if current >= DEEPSPEED_SUB_GROUP_SIZE:
            groups, current = groups + [current], 0
    return groups + ([current] if current else [])


def host_optimizer_share(p: Placement, shape: Shape, world: int) -> float:
    """The share of a rank's optimizer DeepSpeed keeps and updates off the GPU. With ratio < 1 it assigns
    whole sub-groups: sub-group i goes to the CPU when i >= int((1 - ratio) * count) (stage3's
    subgroup_to_device), so the share is coarser than the ratio (an 8B GPT's 8 sub-groups at ratio 0.3
    put 3 of 8 on the CPU)."""
    if p.offload_optimizer == "none":
        return 0.0
    if p.ratio >= 1.0 or p.zero_stage != 3:
        return 1.0
    groups = deepspeed_sub_groups(shape, world)
    return sum(groups[int((1 - p.ratio) * len(groups)):]) / sum(groups)


def params_kept_at_turn(p: Placement, shape: Shape) -> float:
    """Gathered parameter elements ZeRO-3 keeps from the end of forward into backward: a module's
    parameters are not released when they are used again within stage3_max_reuse_distance elements
    (partitioned_param_coordinator.__params_to_release), and at most stage3_max_live_parameters are live.
    They sit on the GPU at the activation peak and are not fetched again for backward. (H200, 1.42B: the
    NVMe run with both at 2e8 read 0.38 GB = 192M parameters less than two full fetches; the CPU-offload run
    with the defaults, 1e9, peaked 1.6 GiB above the same prediction without this term.)"""
    if p.zero_stage != 3:
        return 0.0
    return float(min(p.stage3_max_reuse_distance, p.stage3_max_live_parameters, shape.n_params))


def params_on_nvme(p: Placement, shape: Shape, world: int) -> float:
    """Parameter elements DeepSpeed really keeps on NVMe, all ranks.

    DeepSpeed pins a max_in_cpu buffer but gives a sub-group a place in it only if the whole sub-group fits
    in what is left (stage3._create_fp16_partitions_with_defragmentation). Sub-groups are filled to at least
    sub_group_size, so with the defaults (both 1e9) a rank with more than 1e9 elements keeps none of them in
    RAM: a 1.42B GPT puts all its parameters on NVMe (measured on an H200: 25.50 GB written per step,
    0.004% from this).
    """
    if p.offload_param != "nvme":
        return 0.0
    room = max(1, min(math.ceil(shape.n_params / world), p.max_in_cpu))  # DeepSpeed's empty buffer has 1 element
    used, on_disk = 0, 0
    for group in deepspeed_sub_groups(shape, world):
        if used + group > room:
            on_disk += group
        used += group
    return on_disk * world


def deepspeed_model_states(p: Placement, shape: Shape, world: int) -> Memory:
    """Parameters, gradients and optimizer states of one rank (NVMe: of the host, all its ranks)."""
    m, n, b = Memory(), shape.n_params, ModelStateBytes.deepspeed(shape.param_bytes)
    params_here = n / world if p.zero_stage == 3 else n
    if p.offload_param == "nvme":
        m.add("host_pinned", "parameters (max_in_cpu)", b.param * min(params_here, p.max_in_cpu))
        m.add("nvme", "parameters", b.param * params_on_nvme(p, shape, world))
    else:
        m.add(_place_of(p.offload_param), "parameters", b.param * params_here)
    if p.zero_stage == 3:
        # The layer being gathered: its 16-bit parameters and their gradients (DeepSpeed's largest_layer_memory).
        m.add("gpu", "gathered layer", (b.param + b.grad) * shape.largest_param_numel)
        m.add("gpu", "parameters kept for reuse", b.param * params_kept_at_turn(p, shape))
    if p.offload_optimizer == "none" and p.zero_stage < 3:
        m.add("gpu", "gradients", b.grad * (n if p.zero_stage == 1 else n / world))
    # ZeRO-3 reduces gradients straight into the optimizer's fp32 partition, and with the optimizer
    # offloaded they stream to it as they are reduced: either way they are in `optimizer`.
    optimizer = b.optimizer * n / world
    if p.offload_optimizer == "none":
        m.add("gpu", "optimizer states", optimizer)
    else:
        # ratio < 1 keeps the rest on the GPU (DeepSpeed's partial optimizer offload), updated there by a
        # torch AdamW whose foreach step adds a temporary of one sub-group's fp32 size.
        share = host_optimizer_share(p, shape, world)
        m.add(_place_of(p.offload_optimizer), "optimizer states",
              optimizer * share * (world if p.offload_optimizer == "nvme" else 1))
        if share < 1.0:
            m.add("gpu", "optimizer states", optimizer * (1 - share))
            m.add("gpu_step", "AdamW's temporary (one sub-group)", 4 * max(deepspeed_sub_groups(shape, world)))
    return m


def fsdp2_model_states(p: Placement, shape: Shape, world: int, on_gpu: bool = True) -> Memory:
    """fp32 shards of the parameters and of Adam's m and v, held; the fp32 gradient shards exist from the
    last micro-batch's backward to zero_grad, and torch's AdamW on a GPU (foreach) adds one temporary the
    size of v in its step (`_foreach_sqrt`; on the CPU it loops over tensors, one at a time). Without
    offload the peak is that step (H200, 1.42B: 26.46 GiB measured, 20 bytes a parameter = 26.45 GiB),
    with CPUOffloadPolicy it is the turn."""
    m, n = Memory(), shape.n_params
    temporary = 4 * (n if on_gpu and not p.cpu_offload else shape.largest_param_numel) / world
    if p.cpu_offload:
        m.add("host_pinned", "parameters + gradients (fp32 shards)", 8 * n / world)
        m.add("host_pageable", "optimizer states", 8 * n / world)
        m.add("host_pageable", "AdamW's temporary", temporary)
    else:
        m.add("gpu", "parameters + optimizer states (fp32 shards)", 12 * n / world)
        m.add("gpu_step", "gradients (fp32 shards)", 4 * n / world)
        m.add("gpu_step", "AdamW's temporary", temporary)
    if shape.grad_accum > 1:
        # Without gradient sync (all micro-batches but the last) FSDP2 accumulates unsharded gradients in
        # the reduce dtype (fp32) on the device (FSDPParam.unsharded_accumulated_grad).
        m.add("gpu_turn", "gradients accumulated unsharded (fp32)", 4 * n)
    # One block gathered in the compute precision; the root's embeddings and head stay gathered
    # (reshard_after_forward=False on the root) until backward ends. The turn's peak comes before any
    # unsharded gradient exists; a block's appears once its larger activations are freed (H200, 1.42B,
    # CPUOffloadPolicy: 8.79 GiB measured, 8.77 predicted this way).
    root = 2 * shape.vocab_size * shape.d_model
    m.add("gpu_turn", "gathered block + root", shape.param_bytes * (shape.block_params + root))
    return m


def activation_bytes(shape: Shape, checkpointing: bool) -> float:
    tokens = shape.seq_len * shape.micro_batch
    per_block = 17 * tokens * shape.d_model * shape.param_bytes
    blocks = (shape.n_layers * tokens * shape.d_model * shape.param_bytes + per_block) if checkpointing \
        else shape.n_layers * per_block
    return blocks + loss_bytes(shape)


def loss_bytes(shape: Shape) -> float:
    """Logits in the compute precision, their fp32 copy for the loss and its gradient."""
    return shape.seq_len * shape.micro_batch * shape.vocab_size * (shape.param_bytes + 4 + 4)


def reduce_bucket_bytes(p: Placement, shape: Shape, on_gpu: bool) -> float:
    """DeepSpeed's gradient reduce buckets on the device: one of reduce_bucket_size elements for ZeRO-3
    (stage3's ipg bucket), two for ZeRO-1/2 with overlap_comm (stage_1_and_2.setup_buckets), in the model's
    dtype. They are allocated whole, whatever the model's size; on a CPU device only the pages gradients pass
    through are resident."""
    count = 1 if p.zero_stage == 3 else 2
    elements = count * DEEPSPEED_REDUCE_BUCKET_SIZE
    allocated = shape.param_bytes * (elements if on_gpu else min(elements, shape.n_params))
    if p.zero_stage == 3:
        return allocated  # allocated at initialize, held throughout
    # ZeRO-1/2 allocate theirs at the first gradient and free them after the step (_release_ipg_buffers):
    # in backward, where the loss's logits are already freed, so only what exceeds those adds to the peak.
    return max(0.0, allocated - loss_bytes(shape))


def predict_memory(p: Placement, shape: Shape, world: int, buffers: "SwapBuffers | None" = None,
                   on_gpu: bool = True) -> Memory:
    m = deepspeed_model_states(p, shape, world) if p.engine == "deepspeed" else fsdp2_model_states(p, shape, world, on_gpu)
    m.add("gpu_turn", "activations", activation_bytes(shape, p.activation_checkpointing))
    if p.engine == "deepspeed":
        m.add("gpu", "gradient reduce buckets", reduce_bucket_bytes(p, shape, on_gpu))
    if p.engine == "deepspeed" and p.zero_stage == 3 and p.offload_optimizer == "nvme":
        # ZeRO-3 reduces 16-bit gradients into a pinned buffer of the whole partition, which stays in RAM
        # while the optimizer states are on NVMe (stage3's grad_partitions_flat_buffer).
        m.add("host_pinned", "gradient partitions (16-bit)", shape.param_bytes * math.ceil(shape.n_params / world))
    # Every rank builds the fp32 model on the CPU first except DeepSpeed ZeRO-3 (zero.Init partitions at
    # construction); that copy is freed once the engine holds the model.
    m.host_build_bytes = 0 if (p.engine == "deepspeed" and p.zero_stage == 3) else 4 * shape.n_params
    if buffers is not None and p.engine == "deepspeed":
        if p.offload_param == "nvme":
            m.add("host_pinned", "parameter swap buffers", buffers.param_buffer_count * buffers.param_buffer_size * shape.param_bytes)
        if p.offload_optimizer == "nvme":
            sub_group = max(deepspeed_sub_groups(shape, world))
            m.add("host_pinned", "optimizer swap buffers", buffers.optimizer_buffer_count * sub_group * 4)
    return m


@dataclass(frozen=True)
class SwapBuffers:
    param_buffer_count: int = 5
    param_buffer_size: int = 100_000_000
    optimizer_buffer_count: int = 4


@dataclass(frozen=True)
class Machine:
    gpus: int
    gpu_mem_bytes: float | None
    """Per GPU; None: no GPU (the CPU is the device, as on DeepSpeed's CPU accelerator)."""
    host_mem_bytes: float
    nvme_free_bytes: float | None
    gpu_name: str | None = None


@dataclass(frozen=True)
class Links:
    """Measured bandwidths (bytes/s) and rates of what a step moves and computes."""

    nvme_read: float | None
    nvme_write: float | None
    nvme_source: str
    pcie_h2d: float | None
    pcie_d2h: float | None
    cpu_adam_params_per_s: float
    torch_cpu_adam_params_per_s: float
    host_passes_params_per_s: float
    """Clipping's scale of the fp32 gradient and the fp32 -> 16-bit copy, per parameter, on the host."""
    flops_per_s: float
    """Model FLOP/s the step's forward and backward reach (one block measured), or as given."""
    flops_source: str
    device_adam_params_per_s: float | None = None
    """torch's AdamW as FSDP2 builds it (foreach on a GPU), on the training device; None: not measured
    (planning for a GPU this machine lacks, or links recorded before it was measured), and the bounds
    leave that step out."""
    device_fused_adam_params_per_s: float | None = None
    """torch's fused AdamW on the training device: the stand-in for DeepSpeed's FusedAdam (one kernel a
    chunk, the same bytes)."""


@dataclass(frozen=True)
class StepBound:
    seconds: float
    bottleneck: str
    parts: dict[str, float]
    """Seconds each link or phase needs on its own."""
    bytes_moved: dict[str, float]


def step_bytes(p: Placement, shape: Shape, world: int) -> dict[str, float]:
    """Bytes per optimizer step over each link: NVMe (per host), PCIe (per rank)."""
    n, k, b = shape.n_params, shape.grad_accum, shape.param_bytes
    out = {"nvme_read": 0.0, "nvme_write": 0.0, "pcie_h2d": 0.0, "pcie_d2h": 0.0}
    if p.engine == "deepspeed":
        if p.offload_param != "none":
            # Each micro-batch fetches every parameter for forward and again for backward, but those kept
            # across the turn.
            out["pcie_h2d"] += k * b * (2 * n - params_kept_at_turn(p, shape)) / world
            on_nvme = params_on_nvme(p, shape, world)
            out["nvme_read"] += param_nvme_read_bytes(p, shape, world)
            out["nvme_write"] += b * on_nvme  # the updated 16-bit parameters
        if p.offload_optimizer != "none":
            # Gradients, every micro-batch: ZeRO-3 copies them 16-bit into a pinned buffer, ZeRO-1/2 convert
            # them to fp32 on the GPU first (stage_1_and_2.async_inplace_copy_grad_to_fp32_buffer_from_gpu).
            grad_bytes = b if p.zero_stage == 3 else 4
            share = host_optimizer_share(p, shape, world)
            out["pcie_d2h"] += k * grad_bytes * n / world * share
            out["pcie_h2d"] += param_upload_bytes(p, shape, world)
            if p.offload_optimizer == "nvme":
                swapped = optimizer_swap_bytes(p, shape, world) * share
                out["nvme_read"] += swapped
                out["nvme_write"] += swapped
    elif p.cpu_offload:
        out["pcie_h2d"] += 2 * k * 4 * n / world  # fp32 shards copied up for forward and backward
        out["pcie_d2h"] += 4 * n / world  # the reduced gradient, once a step (sync on the last micro-batch)
    return out


def param_upload_bytes(p: Placement, shape: Shape, world: int) -> float:
    """The updated 16-bit parameters copied back to the GPU after a CPU or NVMe optimizer step, when the
    parameters live on the GPU (with ratio < 1, only the host's share)."""
    if p.engine != "deepspeed" or p.offload_optimizer == "none" or p.offload_param != "none":
        return 0.0
    return host_optimizer_share(p, shape, world) * shape.param_bytes * shape.n_params / world


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
    min_bytes = max(1 << 20, p.aio_block_size)
    states = sum(12 * g for g in deepspeed_sub_groups(shape, world) if 4 * g >= min_bytes)
    grads = sum(4 * numel / world for numel in shape.param_numels if 4 * numel / world >= min_bytes)
    return (states + grads) * world


def step_time_bound(p: Placement, shape: Shape, world: int, links: Links) -> StepBound:
    """Lower bound: compute (at the measured block rate), PCIe and parameter fetches overlap in forward and
    backward; the optimizer phase follows backward: Adam where the optimizer lives, on the host with the
    two passes around it (or the NVMe swap where that is longer) and the updated parameters' upload."""
    moved = step_bytes(p, shape, world)
    tokens = shape.seq_len * shape.micro_batch * shape.grad_accum
    flops = flops_per_token(shape.n_params, shape.n_layers, shape.d_model, shape.seq_len) * tokens
    if p.activation_checkpointing:
        flops *= 4 / 3  # forward once more
    parts = {"compute": flops / links.flops_per_s}
    upload = param_upload_bytes(p, shape, world)
    if links.pcie_h2d:
        parts["pcie_h2d"] = (moved["pcie_h2d"] - upload) / links.pcie_h2d
        parts["pcie_d2h"] = moved["pcie_d2h"] / links.pcie_d2h
    param_nvme = param_nvme_read_bytes(p, shape, world)
    if p.uses_nvme:
        if links.nvme_read is None:
            raise ValueError("an NVMe placement needs measured NVMe bandwidth")
        parts["nvme_params"] = param_nvme / links.nvme_read
    overlapped = max(parts.values())
    optimizer = _optimizer_phase(p, shape, world, links, moved["nvme_read"] - param_nvme, moved["nvme_write"])
    parts.update(optimizer)
    host = optimizer.get("cpu_adam", 0.0) + optimizer.get("host_passes", 0.0)
    seconds = overlapped + max(host, optimizer.get("nvme_optimizer", 0.0)) + optimizer.get("device_adam", 0.0) \
        + optimizer.get("param_upload", 0.0)
    bottleneck = max(parts, key=parts.get)
    return StepBound(seconds, bottleneck, parts, moved)


def _optimizer_phase(p: Placement, shape: Shape, world: int, links: Links, swap_read: float, swap_write: float) -> dict[str, float]:
    """Seconds of each part of the optimizer step, by where the optimizer states live."""
    on_rank = shape.n_params / world
    if p.engine == "fsdp2" and p.cpu_offload:
        return {"cpu_adam": on_rank / links.torch_cpu_adam_params_per_s,
                "host_passes": on_rank / links.host_passes_params_per_s}
    if p.engine == "fsdp2" or p.offload_optimizer == "none":
        rate = links.device_adam_params_per_s if p.engine == "fsdp2" else links.device_fused_adam_params_per_s
        return {"device_adam": on_rank / rate} if rate else {}
    on_host = host_optimizer_share(p, shape, world) * on_rank
    out = {"cpu_adam": on_host / links.cpu_adam_params_per_s, "host_passes": on_host / links.host_passes_params_per_s}
    if on_host < on_rank and links.device_adam_params_per_s:
        # The GPU's sub-groups are updated in the same loop, one sub-group after another, by torch's AdamW.
        out["device_adam"] = (on_rank - on_host) / links.device_adam_params_per_s
    if p.offload_optimizer == "nvme":
        out["nvme_optimizer"] = swap_read / links.nvme_read + swap_write / links.nvme_write
    upload = param_upload_bytes(p, shape, world)
    if upload and links.pcie_h2d:
        out["param_upload"] = upload / links.pcie_h2d
    return out


@dataclass(frozen=True)
class Prediction:
    placement: Placement
    memory: Memory
    fits: bool
    binding: str
    """The constraint that fails, or the tightest one when all hold."""
    step: StepBound | None


def _constraints(m: Memory, machine: Machine, world: int) -> dict[str, tuple[float, float]]:
    """name -> (needed, available), per host."""
    out = {"host RAM": (m.host_bytes * world, machine.host_mem_bytes)}
    if machine.gpu_mem_bytes is not None:
        out["GPU memory"] = (m.gpu_bytes, GPU_USABLE_SHARE * machine.gpu_mem_bytes)
    else:
        # No GPU: "device" memory is host RAM too.
        out["host RAM"] = ((m.host_bytes + m.gpu_bytes) * world, machine.host_mem_bytes)
    if m.nvme_bytes:
        out["NVMe space"] = (m.nvme_bytes, machine.nvme_free_bytes or 0.0)
    return out


def predict(p: Placement, shape: Shape, machine: Machine, links: Links | None, buffers: SwapBuffers | None = None) -> Prediction:
    world = max(1, machine.gpus)
    m = predict_memory(p, shape, world, buffers, on_gpu=machine.gpu_mem_bytes is not None)
    constraints = _constraints(m, machine, world)
    use = {k: need / have if have else math.inf for k, (need, have) in constraints.items()}
    tightest = max(use, key=use.get)
    fits = use[tightest] <= 1.0
    needed, available = constraints[tightest]
    binding = f"{tightest}: {needed / GiB:.1f} of {available / GiB:.1f} GiB"
    if tightest == "GPU memory":
        binding += f" usable ({GPU_USABLE_SHARE:.0%} of {machine.gpu_mem_bytes / GiB:.1f})"
    step = step_time_bound(p, shape, world, links) if links is not None and (links.nvme_read or not p.uses_nvme) else None
    return Prediction(p, m, fits, binding, step)


def plan(shape: Shape, machine: Machine, links: Links | None, buffers: SwapBuffers | None = None) -> list[Prediction]:
    """Every placement, with and without activation checkpointing where the plain one does not fit, plus a
    partial optimizer offload (ratio) when the GPU holds part of the optimizer; feasible ones fastest first."""
    out = []
    for p in candidate_placements():
        pred = predict(p, shape, machine, links, buffers)
        if not pred.fits:
            checkpointed = predict(replace(p, name=f"{p.name}+ac", activation_checkpointing=True), shape, machine, links, buffers)
            pred = checkpointed if checkpointed.fits else pred
        if not pred.fits and p.offload_param == "nvme" and pred.binding.startswith("host RAM"):
            # DeepSpeed keeps up to max_in_cpu parameter elements pinned in RAM even "on NVMe": put them all there.
            on_disk = predict(replace(p, name=f"{p.name}-max_in_cpu0", max_in_cpu=0), shape, machine, links, buffers)
            pred = on_disk if on_disk.fits else pred
        out.append(pred)
        partial = _partial_offload(pred, shape, machine, links, buffers)
        if partial is not None:
            out.append(partial)
    feasible = sorted((x for x in out if x.fits and x.step), key=lambda x: x.step.seconds)
    return feasible + [x for x in out if not (x.fits and x.step)]


def _partial_offload(full: Prediction, shape: Shape, machine: Machine, links: Links | None, buffers) -> Prediction | None:
    """ZeRO-3 with the optimizer on the CPU (`full`, predicted), but only the share (ratio) that does not fit on the GPU."""
    p = full.placement
    if p.engine != "deepspeed" or p.zero_stage != 3 or p.offload_optimizer != "cpu" or p.offload_param != "none" \
            or p.activation_checkpointing or machine.gpu_mem_bytes is None or not full.fits:
        return None
    world = max(1, machine.gpus)
    optimizer_bytes = ModelStateBytes.deepspeed(shape.param_bytes).optimizer * shape.n_params / world
    spare = GPU_USABLE_SHARE * machine.gpu_mem_bytes - full.memory.gpu_bytes
    keep_share = min(1.0, spare / optimizer_bytes) if optimizer_bytes else 0.0
    # DeepSpeed moves whole sub-groups (host_optimizer_share), so the first tenth that covers the need may
    # still keep too much on the GPU: try the next ones up.
    for tenths in range(max(1, math.ceil((1 - keep_share) * 10)), 10):
        ratio = tenths / 10
        pred = predict(replace(p, name=f"zero3-opt-cpu-ratio{ratio:g}", ratio=ratio), shape, machine, links, buffers)
        if pred.fits:
            return pred
    return None


def why_winner(predictions: list[Prediction]) -> str:
    feasible = [x for x in predictions if x.fits and x.step]
    if not feasible:
        tight = min(predictions, key=lambda x: x.memory.gpu_bytes)
        return f"nothing fits: the smallest placement, {tight.placement.name}, needs {tight.binding}"
    win = feasible[0]
    text = (f"{win.placement.name} wins: it fits ({win.binding}) and its bound is {win.step.seconds:.3g} s/step, "
            f"set by {win.step.bottleneck} ({win.step.parts[win.step.bottleneck]:.3g} s)")
    if len(feasible) > 1:
        second = feasible[1]
        text += (f"; next is {second.placement.name} at {second.step.seconds:.3g} s/step, bound by "
                 f"{second.step.bottleneck}")
    faster_unfit = [x for x in predictions if not x.fits and x.step and x.step.seconds < win.step.seconds]
    if faster_unfit:
        text += "; faster but not fitting: " + ", ".join(f"{x.placement.name} ({x.binding})" for x in faster_unfit[:3])
    return text


def buffers_for(shape: Shape) -> SwapBuffers:
    """DeepSpeed's default parameter buffers, each widened to hold the largest parameter."""
    return SwapBuffers(param_buffer_size=max(SwapBuffers().param_buffer_size, shape.largest_param_numel))


def largest_model(presets: dict[str, GPTConfig], shape_of, machine: Machine, links: Links | None) -> tuple[GPTConfig, str] | None:
    """The largest GPT some placement fits: the biggest preset that fits, then the next preset's width with
    as many layers as still fit (bisection on n_layers). `shape_of(cfg)` gives a Shape at the run's batch.
    Returns (config, how it was found), or None when not even the smallest preset fits."""

    def fits(cfg: GPTConfig) -> bool:
        shape = shape_of(cfg)
        return any(x.fits for x in plan(shape, machine, links, buffers_for(shape)))

    ordered = sorted(presets.items(), key=lambda kv: kv[1].n_params)
    fitting = [(name, cfg) for name, cfg in ordered if fits(cfg)]
    if not fitting:
        return None
    name, best = fitting[-1]
    found = f"preset {name}"
    bigger = [(n, cfg) for n, cfg in ordered if cfg.n_params > best.n_params]
    if bigger:
        wider_name, wider = bigger[0]
        low, high = 0, wider.n_layers  # fits(low layers) holds or low = 0; fits(high) does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(replace(wider, n_layers=mid)) else (low, mid)
        if low and replace(wider, n_layers=low).n_params > best.n_params:
            best, found = replace(wider, n_layers=low), f"{wider_name}'s width with {low} of its {wider.n_layers} layers"
    return best, found
