"""What every placement's prediction is made of, whatever its engine: the model's shape, bytes by place,
the machine, measured link rates, and activations.

Activations per block and token (16-bit, flash/efficient attention, so no seq^2 term), what autograd
saves in `model.Block`: the two LayerNorms' inputs and the QKV input (d each), the QKV output that attention
keeps as q, k, v (3d), attention's output and the contiguous copy the projection takes (d + d), the first
MLP matmul's input (d), the GELU's input and the second matmul's input (4d + 4d): 17 elements x d_model.
With activation checkpointing only the block's input is kept, plus one block's worth while recomputing.
The loss adds the logits (16-bit) and their fp32 copy and gradient, per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from offloadlab.spec import DeepSpeedStrategy, FSDP2Strategy, Strategy
from offloadlab.workload.model import GPTConfig

GiB = 1 << 30
# Resident host bytes of a training process before any model state (Python, torch, the runtime);
# a tiny CPU run's whole RSS is 340-420 MiB.
HOST_BASELINE_BYTES = 512 << 20
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
        return cls(
            cfg.n_layers,
            cfg.d_model,
            cfg.vocab_size,
            seq_len,
            micro_batch,
            grad_accum,
            2 if precision == "bf16" else 4,
            tuple(cfg.param_numels()),
        )

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


def _zero(name: str, stage: int, optimizer: str = "none", param: str = "none") -> Placement:
    return Placement(
        DeepSpeedStrategy(
            name=name, engine="deepspeed", zero_stage=stage, offload_optimizer=optimizer, offload_param=param
        )
    )


def candidate_placements() -> list[Placement]:
    """Every placement offloadlab can run: ZeRO 1/2/3 x none/cpu/nvme where DeepSpeed allows it, FSDP2 +- offload."""
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
    out += [
        Placement(FSDP2Strategy(name="fsdp2", engine="fsdp2")),
        Placement(FSDP2Strategy(name="fsdp2-cpu-offload", engine="fsdp2", cpu_offload=True)),
    ]
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


def activation_bytes(shape: Shape, checkpointing: bool) -> float:
    tokens = shape.seq_len * shape.micro_batch
    per_block = 17 * tokens * shape.d_model * shape.param_bytes
    blocks = (
        (shape.n_layers * tokens * shape.d_model * shape.param_bytes + per_block)
        if checkpointing
        else shape.n_layers * per_block
    )
    return blocks + loss_bytes(shape)


def loss_bytes(shape: Shape) -> float:
    """Logits in the compute precision, their fp32 copy for the loss and its gradient."""
    return shape.seq_len * shape.micro_batch * shape.vocab_size * (shape.param_bytes + 4 + 4)


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


def buffers_for(shape: Shape) -> SwapBuffers:
    """DeepSpeed's default parameter buffers, each widened to hold the largest parameter."""
    return SwapBuffers(param_buffer_size=max(SwapBuffers().param_buffer_size, shape.largest_param_numel))
