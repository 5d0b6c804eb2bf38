"""What every placement's prediction is made of, whatever its engine: the model's shape, bytes by place,
the machine, measured link rates, and activations.

Activations: what autograd saves per block and token: the GPT's `model.Block` by formula
(`gpt_block_activation_bytes`, flash attention, no seq^2 term), a Hugging Face model's decoder layer counted
on its own code (`plan/activations.py`, whatever attention it runs), each checked against a real block's
saved tensors in tests. With activation checkpointing only the block's input is kept, plus one block's
worth while recomputing (an upper bound: the recompute and the loss's logits are not live together).
The loss adds the logits (16-bit) and their fp32 copy and gradient, per micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from offloadlab.spec import RunSpec, Strategy
from offloadlab.workload.model import GPTConfig, gpt_config

GiB = 1 << 30
# Resident host bytes of a training process before any model state (Python, torch, the runtime);
# a tiny CPU run's whole RSS is 340-420 MiB.
HOST_BASELINE_BYTES = 512 << 20
# The same on a GPU, where the CUDA runtime, cuBLAS and NCCL are loaded: FSDP2 without offload at 1.42B
# peaked 0.88 GiB above its predicted states plus the CPU's baseline on three H200 machines (sessions 6,
# 10, 12), and FSDP2 + CPU offload 1.1-1.8 GiB above.
HOST_BASELINE_CUDA_BYTES = HOST_BASELINE_BYTES + (900 << 20)
# The share of a GPU's memory a plan may fill with what it predicts: the rest is left to the CUDA context
# and the caching allocator's fragmentation (reserved ran 5-60% above allocated in the H200 runs).
GPU_USABLE_SHARE = 0.9
# RAM a plan leaves beside its workers, of what is available when it is made: torchrun's agent (0.4 GiB),
# the kernel's page tables for the workers (8 bytes a 4 KiB page: 0.24 GiB at 123 GiB) and the run's own
# process, which holds ~0.8 GiB more than the planning one. On the H200 (session 16, 124.9 GiB available
# to the plan) the largest worker that lived peaked at 122.6 GiB with 0.17 left; those one layer larger
# were killed with the process tree at 123.1-123.2.
HOST_RESERVED_BYTES = 2 * GiB


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
    """Elements of each parameter tensor, as the model builds them (tied ones once)."""
    block_params: int
    """Parameters of one block (what FSDP2 gathers at a time)."""
    block_activation_bytes_per_token: int
    """Bytes autograd saves in one block for each token (tests/test_plan.py measures them)."""

    @classmethod
    def of(cls, cfg: GPTConfig, seq_len: int, micro_batch: int, grad_accum: int, precision: str) -> "Shape":
        cfg = replace(cfg, max_seq_len=seq_len)  # the position table is built for the run's sequence length
        param_bytes = 2 if precision == "bf16" else 4
        numels = tuple(cfg.param_numels())
        block_params = (
            sum(numels) - 2 * cfg.vocab_size * cfg.d_model - cfg.max_seq_len * cfg.d_model - 2 * cfg.d_model
        ) // cfg.n_layers
        return cls(
            cfg.n_layers,
            cfg.d_model,
            cfg.vocab_size,
            seq_len,
            micro_batch,
            grad_accum,
            param_bytes,
            numels,
            block_params,
            gpt_block_activation_bytes(cfg.d_model, param_bytes),
        )

    @classmethod
    def of_hf(cls, config, seq_len: int, micro_batch: int, grad_accum: int, precision: str) -> "Shape":
        """A Hugging Face config's exact parameter tensors (built on the meta device: no memory, no init)."""
        from offloadlab.plan.activations import block_saved_bytes_per_token
        from offloadlab.workload.hf import meta_model

        model = meta_model(config)
        numels = tuple(p.numel() for p in model.inner.parameters())  # tied weights appear once
        param_bytes = 2 if precision == "bf16" else 4
        return cls(
            len(model.blocks),
            config.hidden_size,
            config.vocab_size,
            seq_len,
            micro_batch,
            grad_accum,
            param_bytes,
            numels,
            sum(p.numel() for p in model.blocks[0].parameters()),
            block_saved_bytes_per_token(config, seq_len, precision),
        )

    @property
    def n_params(self) -> int:
        return sum(self.param_numels)

    @property
    def largest_param_numel(self) -> int:
        return max(self.param_numels)

    @property
    def root_params(self) -> int:
        """Parameters outside the blocks: embeddings, head, final norm."""
        return self.n_params - self.n_layers * self.block_params


def params_text(n_params: int) -> str:
    """1.42B params, or 124M params below a billion (a tiny model planned as "0.00B params")."""
    if n_params >= 1e9:
        return f"{n_params / 1e9:.2f}B params"
    return f"{n_params / 1e6:.3g}M params" if n_params >= 1e6 else f"{n_params:,} params"


def shape_of_spec(spec: RunSpec) -> Shape:
    """The spec's model at its batch: a GPT's shape, or a Hugging Face config's exact tensors."""
    batch = (spec.seq_len, spec.micro_batch, spec.grad_accum, spec.precision)
    if spec.model.is_hf:
        from offloadlab.workload.hf import spec_config

        return Shape.of_hf(spec_config(spec.model), *batch)
    return Shape.of(gpt_config(spec.model, spec.seq_len), *batch)


def compute_stand_in(spec: RunSpec) -> GPTConfig:
    """The GPT whose block the compute probe times for this spec: the model's own for a GPT, one of the
    same width and heads for a Hugging Face model (the FLOP rate follows the matmuls' sizes)."""
    if not spec.model.is_hf:
        return gpt_config(spec.model, spec.seq_len)
    from offloadlab.workload.hf import spec_config

    c = spec_config(spec.model)
    return GPTConfig(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.vocab_size, spec.seq_len)


def gpt_block_activation_bytes(d_model: int, param_bytes: int) -> int:
    """`model.Block`, per token: the two LayerNorms' inputs and the QKV input (d each), q, k, v (3d),
    attention's output (d), the MLP input (d), the GELU's input and the second matmul's input (4d + 4d):
    16 d in the compute precision (16.1 d measured on a real block; on the H200 the 1.42B GPT's peaks hold
    to 2% with it and `loss_bytes`)."""
    return 16 * d_model * param_bytes


@dataclass(frozen=True)
class Placement:
    """A run spec's strategy as the planner weighs it, with the model's activation checkpointing: `plan`
    reads the same strategy types as `run`, and writes the winner's back into a spec unchanged."""

    strategy: Strategy
    activation_checkpointing: bool = False

    @property
    def name(self) -> str:
        return self.strategy.name

    def varied(self, name: str, activation_checkpointing: bool | None = None, **changes) -> "Placement":
        """The same placement under another name with some strategy fields changed (validated as in a spec)."""
        strategy = type(self.strategy)(**{**self.strategy.model_dump(), "name": name, **changes})
        checkpointing = self.activation_checkpointing if activation_checkpointing is None else activation_checkpointing
        return Placement(strategy, checkpointing)

    def with_ratios(self, name: str, spare_gpu_bytes: float, optimizer_gpu_bytes: float) -> list["Placement"]:
        """Partial optimizer offloads, `{name}-ratio{r}`: the ratios (share on the CPU, in tenths) whose GPU
        part fits the spare bytes, smallest first, where all of the optimizer on the GPU would take
        optimizer_gpu_bytes."""
        keep_share = min(1.0, spare_gpu_bytes / optimizer_gpu_bytes) if optimizer_gpu_bytes else 0.0
        smallest = max(1, math.ceil((1 - keep_share) * 10))
        return [self.varied(f"{name}-ratio{tenths / 10:g}", ratio=tenths / 10) for tenths in range(smallest, 10)]


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
    runtime_bytes: float = HOST_BASELINE_BYTES
    """The process before any model state: HOST_BASELINE_BYTES, or HOST_BASELINE_CUDA_BYTES on a GPU."""

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
        return self.runtime_bytes + max(self.host_build_bytes, self.host_state_bytes)

    @property
    def pinned_bytes(self) -> float:
        return sum(self.host_pinned.values())

    @property
    def nvme_bytes(self) -> float:
        return sum(self.nvme.values())


def activation_bytes(shape: Shape, checkpointing: bool) -> float:
    tokens = shape.seq_len * shape.micro_batch
    per_block = tokens * shape.block_activation_bytes_per_token
    blocks = (
        (shape.n_layers * tokens * shape.d_model * shape.param_bytes + per_block)
        if checkpointing
        else shape.n_layers * per_block
    )
    return blocks + loss_bytes(shape)


def loss_bytes(shape: Shape) -> float:
    """The loss at its peak, early in backward: log-softmax's saved fp32 output, the fp32 gradient that
    reaches it and the fp32 gradient of the logits, 12 bytes a logit in either precision (the 16-bit logits
    and their fp32 copy are freed by then; three fp32 logit-sized tensors are what torch's allocator history
    shows live at the H200's peak for Llama- and Qwen-shaped models)."""
    return shape.seq_len * shape.micro_batch * shape.vocab_size * 12


@dataclass(frozen=True)
class Machine:
    gpus: int
    gpu_mem_bytes: float | None
    """Per GPU; None: no GPU (the CPU is the device, as on DeepSpeed's CPU accelerator)."""
    host_mem_bytes: float
    nvme_free_bytes: float | None
    gpu_name: str | None = None
    pinned_exact: bool = True
    """Whether the workers' pinned buffers take their exact sizes (torch 2.13 with the setting `run` gives
    them); False: torch's pinned allocator rounds each up to a power of two (torch 2.11)."""


def pinned_rounding_bytes(sizes: list[float]) -> float:
    """What rounding each pinned buffer up to a power of two adds (a 5.28 GiB buffer takes 8)."""
    return sum(2 ** math.ceil(math.log2(size)) - size for size in sizes if size > 0)


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
    (planning for a GPU this machine lacks, or links recorded before it was measured), and the predictions
    leave that step out."""
    device_fused_adam_params_per_s: float | None = None
    """torch's fused AdamW on the training device: the stand-in for DeepSpeed's FusedAdam (one kernel a
    chunk, the same bytes)."""
    converting_upload_params_per_s: float | None = None
    """What ZeRO-3's upload of the updated parameters adds to the host passes when they live on the GPU:
    a converting copy from pageable memory (`measure_converting_upload_params_per_s`); None: not measured,
    and that upload is bounded at the pinned PCIe rate."""


@dataclass(frozen=True)
class StepPrediction:
    seconds: float
    bottleneck: str
    parts: dict[str, float]
    """Seconds each link or phase needs on its own."""
    bytes_moved: dict[str, float]
    training_s: float
    """Forward and backward with what overlaps them; the rest of `seconds` follows backward (the optimizer
    phase), as a run's phase timings split a step."""

    @property
    def optimizer_s(self) -> float:
        return self.seconds - self.training_s


def pinned_if_asked(strategy) -> str:
    """Where a host buffer an engine pins only with the strategy's `pin_memory` goes."""
    return "host_pinned" if strategy.pin_memory else "host_pageable"
