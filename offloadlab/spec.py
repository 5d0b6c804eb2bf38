"""Run spec: the typed, validated description of one comparison run, loaded from TOML.

Everything downstream (plan, engine adapters, trainer) reads these models, never raw dicts.
Unknown keys and bad values raise `SpecError` with the key's path, before any work starts.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import typing
from collections import Counter
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    TypeAdapter,
    ValidationError,
    model_validator,
)


class SpecError(ValueError):
    """A run spec that cannot be used; the message names the key and the fix."""


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def _safe_name(name: str) -> str:
    """Names become folder and file names (checkpoints/NAME, the NVMe swap folder): no separators, no
    leading dot, nothing a shell or glob reads specially."""
    if not _SAFE_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a usable name: use 1-64 letters, digits and . _ + -, starting with a "
            "letter or digit (it names folders)"
        )
    return name


SafeName = Annotated[str, AfterValidator(_safe_name)]


class _Strict(BaseModel):
    # strict: TOML gives real types, so `steps = true` or `pin_memory = 1` is a mistake, not a number or a
    # flag (true ran one step); lax ints also took 2.0. Floats take TOML's integers (`lr = 1`), never inf or
    # nan (nan reached the store as a NULL loss and failed the strategy). Fields whose type TOML cannot
    # write (a path is a string, a pair is an array) say `strict=False` themselves. The docstrings under the
    # fields are read by docs/gen_spec.py, not by pydantic (which would parse this file at every import).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


LaxPath = Annotated[Path, Field(strict=False)]
"""A path, given as TOML's string."""


class ModelSpec(_Strict):
    preset: str | None = None
    """A built-in GPT: tiny, small-cpu, gpt-125m, gpt-350m, gpt-760m, gpt-1.4b, gpt-2.7b, gpt-6.7b, gpt-13b,
    gpt-30b or gpt-70b (`offloadlab.workload.model.PRESETS`)."""
    hf_model: LaxPath | None = None
    """A local Hugging Face checkpoint folder (config.json + *.safetensors): trained from its weights."""
    hf_config: LaxPath | None = None
    """A local Hugging Face `config.json` (or its folder): the same model with random weights (seeded)."""
    d_model: int | None = Field(default=None, gt=0)
    """Override or define the hidden size."""
    n_layers: int | None = Field(default=None, gt=0)
    """Override or define the number of transformer blocks."""
    n_heads: int | None = Field(default=None, gt=0)
    """Override or define the attention heads; d_model must be divisible by it."""
    vocab_size: int | None = Field(default=None, gt=0)
    """Override or define the vocabulary size."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward (applied the same way for both engines)."""

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        explicit = all(v is not None for v in (self.d_model, self.n_layers, self.n_heads, self.vocab_size))
        sources = [k for k in ("preset", "hf_model", "hf_config") if getattr(self, k) is not None]
        if not sources and not explicit:
            raise ValueError(
                "set model.preset, model.hf_model, model.hf_config, or all of d_model/n_layers/n_heads/vocab_size"
            )
        if len(sources) > 1:
            raise ValueError(f"set only one of model.{' and model.'.join(sources)}")
        return self

    @property
    def hf_path(self) -> Path | None:
        """The Hugging Face folder (or config.json) the model comes from, with or without its weights."""
        return self.hf_model or self.hf_config

    @property
    def is_hf(self) -> bool:
        return self.hf_path is not None


class DataSpec(_Strict):
    kind: Literal["synthetic", "tokens", "text"] = "synthetic"
    """synthetic: seeded random tokens; tokens: a .npy or raw int32/uint16 file; text: UTF-8 text (a .txt
    file, or .jsonl with one document a line) through a Hugging Face model's own tokenizer, or as bytes
    for a GPT preset; documents are joined with the tokenizer's end-of-text token and packed to seq_len."""
    path: LaxPath | None = None
    """The file for kind = "tokens" or "text"."""
    token_dtype: Literal["int32", "uint16"] = "int32"
    """Element type of a raw (non-.npy) token file."""
    text_key: str = "text"
    """The field that holds each document of a .jsonl file."""

    @model_validator(mode="after")
    def _path_needed(self) -> "DataSpec":
        if self.kind != "synthetic" and self.path is None:
            raise ValueError(f'data.kind = "{self.kind}" needs data.path')
        if self.path is not None and not self.path.is_file():
            raise ValueError(f"data.path {self.path} is not a file")
        return self


OffloadDevice = Literal["none", "cpu", "nvme"]


class AioSettings(_Strict):
    """DeepSpeed's `aio` section, under the keys DeepSpeed 0.19.8 reads (see swap_tensor/aio_config.py); the
    defaults are DeepSpeed's. The one type from the tuner's points through tuned.toml and the run store to
    DeepSpeed's JSON (`model_dump()` is that section)."""

    block_size: int = Field(default=1048576, gt=0)
    """Bytes of each read or write request."""
    queue_depth: int = Field(default=8, gt=0)
    """Requests in flight."""
    intra_op_parallelism: int = Field(default=1, gt=0)
    """Threads of each aio handle (ds_nvme_tune writes it as num_threads, which DeepSpeed ignores)."""
    # Not strict: a tune store's points come back from SQLite's integer columns as 0 and 1.
    single_submit: bool = Field(default=False, strict=False)
    """Submit requests one at a time instead of as one batch."""
    overlap_events: bool = Field(default=True, strict=False)
    """Submit new requests without waiting for the earlier ones to complete."""

    def label(self) -> str:
        return (
            f"bs={self.block_size // 1024}K qd={self.queue_depth} t={self.intra_op_parallelism} "
            f"ss={int(self.single_submit)} ov={int(self.overlap_events)}"
        )

    def with_(self, **changes) -> "AioSettings":
        """A copy with some settings changed, validated like any other."""
        return AioSettings(**{**self.model_dump(), **changes})


class ZenFlowSettings(_Strict):
    """DeepSpeed's `zenflow` block (runtime/zenflow/zenflow_config.py), defaults as DeepSpeed's. ZenFlow
    updates the top-k gradient columns on the GPU every step and the rest on the CPU every update_interval
    steps, overlapped with training when overlap_step is on: faster, but not exact AdamW."""

    topk_ratio: float = Field(default=0.1, gt=0, lt=1)
    """Share of gradient columns updated on the GPU each step."""
    select_strategy: Literal["auto", "step", "epoch"] = "auto"
    """When the top-k columns are selected again: every select_interval steps ("step") or epochs ("epoch"),
    or as DeepSpeed decides ("auto")."""
    select_interval: int | Literal["auto"] = "auto"
    """Steps (or epochs) between re-selecting the top-k columns; an integer unless select_strategy = "auto".
    Measured on a 1.42B GPT: "step" with 4 made each re-selection a 2.8-3.6 s step; "auto" had none
    (bench/results/2026-12-05-h200-s21)."""
    update_interval: int | Literal["auto"] = "auto"
    """Steps between the CPU's updates of the other columns: the GPU steps in between hide the CPU's update
    only if they take longer (1.42B on 16 cores: an update of about 1.6 s against 0.19 s steps; every 4th
    step waited 0.9-1.9 s, every 16th none)."""
    overlap_step: bool = False
    """Run the CPU update in worker processes while the next steps train."""
    offload: bool = False
    """Keep the selective optimizer's states in CPU memory too."""
    auto_ratio: float = Field(default=0.99, ge=0, le=1)
    """DeepSpeed's ZenFlow setting of this name."""
    full_warm_up_rounds: int = Field(default=0, ge=0)
    """DeepSpeed's ZenFlow setting of this name."""
    pt_reserved_cores_perc: float = Field(default=0.5, ge=0, le=1)
    """Share of the CPU cores left to torch; the rest run ZenFlow's optimizer workers."""

    @model_validator(mode="after")
    def _intervals(self) -> "ZenFlowSettings":
        if self.select_strategy == "auto" and self.select_interval != "auto":
            raise ValueError('select_interval must stay "auto" with select_strategy = "auto"')
        if self.select_strategy != "auto" and self.select_interval == "auto":
            raise ValueError(f'select_strategy = "{self.select_strategy}" needs an integer select_interval')
        for key in ("select_interval", "update_interval"):
            if isinstance(getattr(self, key), int) and getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1")
        if isinstance(self.select_interval, int) and isinstance(self.update_interval, int):
            if self.select_interval < self.update_interval:
                raise ValueError("select_interval must be at least update_interval")
        return self


class DeepSpeedStrategy(_Strict):
    name: SafeName
    """Names the strategy's row and its folders: 1-64 letters, digits and . _ + -."""
    engine: Literal["deepspeed"]
    """DeepSpeed ZeRO."""
    # An int, not Literal[1, 2, 3]: a Literal takes `zero_stage = true` for 1.
    zero_stage: int = Field(default=3, ge=1, le=3)
    """ZeRO stage: 1 partitions the optimizer state, 2 the gradients too, 3 the parameters too."""
    offload_optimizer: OffloadDevice = "none"
    """Where the optimizer state lives and steps: the GPU ("none"), the CPU, or NVMe (stage 3)."""
    offload_param: OffloadDevice = "none"
    """Where the parameters live; parameter offload exists only at ZeRO stage 3."""
    pin_memory: bool = True
    """Pin the offloaded buffers in host RAM."""
    buffer_count: int = Field(default=5, gt=0)
    """Parameter swap buffers (offload_param = "nvme")."""
    buffer_size: int = Field(default=100_000_000, gt=0)
    """Elements per parameter swap buffer; must hold the largest parameter."""
    max_in_cpu: int = Field(default=1_000_000_000, ge=0)
    """Parameter elements kept in CPU memory when offload_param = "nvme"."""
    optimizer_buffer_count: int = Field(default=4, gt=0)
    """Optimizer swap buffers (offload_optimizer = "nvme"): 4 for each sub-group in flight."""
    cpu_cores_per_rank: int | None = Field(default=None, gt=0)
    """Physical cores each rank is bound to, and the threads its CPU optimizer runs (DeepSpeed's CPU Adam,
    torch's AdamW on the CPU); default: an equal share of this host's physical cores."""
    ratio: float = Field(default=1.0, gt=0, le=1)
    """Share of optimizer states offloaded (DeepSpeed's partial offload)."""
    stage3_max_live_parameters: int = Field(default=1_000_000_000, gt=0)
    """DeepSpeed's ZeRO-3 setting of this name: parameter elements resident on a GPU before any are released."""
    stage3_max_reuse_distance: int = Field(default=1_000_000_000, gt=0)
    """DeepSpeed's ZeRO-3 setting of this name: a parameter used again within this many is kept."""
    stage3_prefetch_bucket_size: int = Field(default=50_000_000, gt=0)
    """DeepSpeed's ZeRO-3 setting of this name: elements fetched ahead of use."""
    sub_group_size: int = Field(default=1_000_000_000, gt=0)
    """ZeRO-3's optimizer sub-group, in elements: the tile the NVMe optimizer swaps and steps at a time."""
    pipeline_read: bool = False
    """offload_optimizer = "nvme": read the next sub-group while the current one steps."""
    pipeline_write: bool = False
    """offload_optimizer = "nvme": write the previous sub-group while the current one steps."""
    super_offload: bool = False
    """DeepSpeed's SuperOffload (ZeRO-3, optimizer on the CPU; made for Grace-Hopper superchips)."""
    cpuadam_cores_perc: float = Field(default=0.8, gt=0, le=1)
    """super_offload: the share of CPU cores its CPU Adam workers use."""
    bf16_master_weights: bool = False
    """DeepSpeed's bf16_master_weights_and_grads and bf16_optimizer_states (precision = "bf16",
    offload_optimizer = "cpu"): the offloaded master weights, gradients and Adam moments in bf16, 8 bytes a
    parameter instead of 16: less host memory and traffic for the CPU step, not exact AdamW. Both together:
    with fp32 moments beside bf16 masters a restored checkpoint's moments differ (torch's load_state_dict
    casts them to the parameters' bf16; the checkpoint check caught it)."""
    zenflow: ZenFlowSettings | None = None
    """DeepSpeed's ZenFlow (optimizer on the CPU): a [strategy.zenflow] table turns it on."""
    aio: AioSettings = AioSettings()
    """DeepSpeed's aio settings, a [strategy.aio] table; a `tuned` fragment fills it."""
    tuned_drive_gbps: tuple[PositiveFloat, PositiveFloat] | None = Field(default=None, strict=False)
    """(read, write) GB/s `offloadlab tune` measured on the drive with these aio settings: taken from a
    `tuned` fragment's [measured], and what `compare` holds the run's NVMe rates against."""

    @model_validator(mode="after")
    def _placement(self) -> "DeepSpeedStrategy":
        if self.offload_param != "none" and self.zero_stage != 3:
            raise ValueError(f"offload_param = {self.offload_param!r} needs zero_stage = 3")
        if self.offload_optimizer == "nvme" and self.zero_stage != 3:
            raise ValueError('offload_optimizer = "nvme" needs zero_stage = 3')
        if (self.pipeline_read or self.pipeline_write) and self.offload_optimizer != "nvme":
            raise ValueError(
                'pipeline_read and pipeline_write pipeline NVMe swaps: they need offload_optimizer = "nvme"'
            )
        in_flight = 1 + self.pipeline_read + self.pipeline_write
        if in_flight > 1 and self.optimizer_buffer_count < 4 * in_flight:
            # Each sub-group in flight holds 4 buffers (fp32 master, gradient, m, v): measured, 8 fail with
            # both pipelines on ("PipelinedOptimizerSwapper ran out of swap buffers") and 12 run.
            raise ValueError(
                f"pipelining keeps {in_flight} sub-groups in flight, 4 buffers each: "
                f"set optimizer_buffer_count >= {4 * in_flight}"
            )
        if self.super_offload and (self.zero_stage != 3 or self.offload_optimizer != "cpu"):
            raise ValueError('super_offload needs zero_stage = 3 and offload_optimizer = "cpu"')
        if self.zenflow is not None and self.offload_optimizer != "cpu":
            raise ValueError('zenflow needs offload_optimizer = "cpu" (it splits the update between GPU and CPU)')
        if self.zenflow is not None and self.super_offload:
            raise ValueError("choose zenflow or super_offload: DeepSpeed runs one CPU optimizer")
        if self.bf16_master_weights and self.offload_optimizer != "cpu":
            # DeepSpeed 0.19.8 asserts that bf16 masters are stepped by its CPU Adam (ZeRO-Offload).
            raise ValueError('bf16_master_weights needs offload_optimizer = "cpu"')
        return self

    @property
    def exact(self) -> bool:
        """Whether each step applies exact AdamW as ZeRO does. ZenFlow's selective updates do not.
        SuperOffload is meant to, but on an H200 its losses left ZeRO-3's at step 12 (+6.5%, after 11 steps
        within 2e-4; bench/results/2026-12-04-h200-s11): it is held to the exact ones' last loss too.
        bf16 master weights round every update to bf16."""
        return self.zenflow is None and not self.super_offload and not self.bf16_master_weights

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    @property
    def cpu_update_interval(self) -> int | None:
        """Steps between ZenFlow's CPU updates, where it has a fixed interval; None for a step-wise update."""
        interval = self.zenflow.update_interval if self.zenflow is not None else None
        return interval if isinstance(interval, int) else None

    @property
    def needs_cuda(self) -> str | None:
        """Why this strategy cannot run without a CUDA GPU, or None."""
        if self.super_offload:
            return "super_offload runs only on CUDA GPUs (DeepSpeed's SuperOffload asserts it)"
        return None

    @property
    def single_gpu(self) -> bool:
        return False

    @property
    def uses_nvme(self) -> bool:
        return "nvme" in (self.offload_optimizer, self.offload_param)

    @property
    def swaps_parameters(self) -> bool:
        """Parameters live on NVMe and stream through pinned swap buffers (what `tune --spec` sizes)."""
        return self.offload_param == "nvme"

    @property
    def ops_needed(self) -> tuple[str, ...]:
        """DeepSpeed's compiled ops this strategy loads: its CPU Adam when the optimizer is offloaded, else
        FusedAdam; aio when anything swaps to NVMe; the CPU accelerator's shared-memory collectives."""
        adam = "cpu_adam" if self.offload_optimizer != "none" else "fused_adam"
        return (adam, "deepspeed_shm_comm") + (("async_io",) if self.uses_nvme else ())


class FSDP2Strategy(_Strict):
    name: SafeName
    """Names the strategy's row and its folders: 1-64 letters, digits and . _ + -."""
    engine: Literal["fsdp2"]
    """PyTorch FSDP2 (`fully_shard`)."""
    cpu_offload: bool = False
    """Wrap with CPUOffloadPolicy: parameters, gradients and optimizer step live on the CPU."""
    pin_memory: bool = True
    """cpu_offload: pin the CPU shards (CPUOffloadPolicy's pin_memory)."""
    reshard_after_forward: bool = True
    """Free each block's gathered parameters after forward (fully_shard's setting); false keeps them for
    backward, which then needs no all-gather."""
    cpu_optimizer: Literal["torch", "deepspeed"] = "torch"
    """cpu_offload: which AdamW steps the CPU shards: torch's, or DeepSpeed's CPU Adam (SIMD, threaded;
    the same update)."""
    cpu_cores_per_rank: int | None = Field(default=None, gt=0)
    """Physical cores each rank is bound to, and the threads its CPU optimizer runs (DeepSpeed's CPU Adam,
    torch's AdamW on the CPU); default: an equal share of this host's physical cores."""

    @model_validator(mode="after")
    def _optimizer_on_cpu(self) -> "FSDP2Strategy":
        if self.cpu_optimizer != "torch" and not self.cpu_offload:
            raise ValueError(f'cpu_optimizer = "{self.cpu_optimizer}" steps CPU shards: it needs cpu_offload = true')
        return self

    @property
    def exact(self) -> bool:
        return True

    @property
    def offloads(self) -> bool:
        return self.cpu_offload

    @property
    def cpu_update_interval(self) -> int | None:
        return None

    @property
    def needs_cuda(self) -> str | None:
        return None

    @property
    def single_gpu(self) -> bool:
        return False

    @property
    def uses_nvme(self) -> bool:
        return False

    @property
    def swaps_parameters(self) -> bool:
        return False

    @property
    def ops_needed(self) -> tuple[str, ...]:
        return ("cpu_adam",) if self.cpu_optimizer == "deepspeed" else ()


class TorchAOStrategy(_Strict):
    name: SafeName
    """Names the strategy's row and its folders: 1-64 letters, digits and . _ + -."""
    engine: Literal["torchao"]
    """torchao's CPUOffloadOptimizer on one GPU: the whole model (fp32) on the GPU, each parameter's AdamW
    on the CPU, its gradient copied down as soon as backward has it and the update copied back as each
    parameter is stepped. One GPU only: it does not shard (FSDP2's sharded parameters never fire its hooks)."""
    offload_gradients: bool = False
    """Free each GPU gradient once it is copied to the CPU (4 bytes a parameter less GPU memory); torchao
    does not allow it with gradient accumulation."""
    cpu_optimizer: Literal["deepspeed", "torch"] = "deepspeed"
    """The AdamW each parameter steps with on the CPU: DeepSpeed's CPU Adam (SIMD, threaded), or torch's
    fused AdamW (torchao's default); the same update."""
    cpu_cores_per_rank: int | None = Field(default=None, gt=0)
    """Physical cores the rank is bound to, and the threads torch's AdamW runs on the CPU; default: this
    host's physical cores."""
    ratio: float = Field(default=1.0, gt=0, le=1)
    """The share of the offloadable parameters (in model order, the last ones) whose AdamW steps on the
    CPU, as DeepSpeed's offload_optimizer ratio: the rest step on the GPU beside the CPU's steps, their Adam
    moments kept there. Lower is faster where the GPU has the room."""
    bf16_master_weights: bool = False
    """The model, its gradients and the CPU's masters and Adam moments in bf16 (precision = "bf16"), as
    DeepSpeed's option of that name: 8 bytes a parameter on the host instead of 16, half the PCIe copies
    and half the memory the CPU step streams through; not exact AdamW (each update is rounded to bf16)."""

    @property
    def exact(self) -> bool:
        """torch's AdamW on fp32 master weights, with the spec's gradient clipping (offloadlab scales the
        CPU gradients; torchao alone does not clip); bf16 master weights round every update to bf16."""
        return not self.bf16_master_weights

    @property
    def offloads(self) -> bool:
        return True

    @property
    def cpu_update_interval(self) -> int | None:
        return None

    @property
    def needs_cuda(self) -> str | None:
        return "torchao's CPUOffloadOptimizer runs only on CUDA (or XPU) GPUs: its constructor asserts it"

    @property
    def single_gpu(self) -> bool:
        """Trains on one GPU only (its optimizer neither shards nor reduces)."""
        return True

    @property
    def uses_nvme(self) -> bool:
        return False

    @property
    def swaps_parameters(self) -> bool:
        return False

    @property
    def ops_needed(self) -> tuple[str, ...]:
        return ("cpu_adam",) if self.cpu_optimizer == "deepspeed" else ()


Strategy = Annotated[Union[DeepSpeedStrategy, FSDP2Strategy, TorchAOStrategy], Field(discriminator="engine")]
STRATEGY_MODELS = {"deepspeed": DeepSpeedStrategy, "fsdp2": FSDP2Strategy, "torchao": TorchAOStrategy}
ENGINE_TAGS = tuple(STRATEGY_MODELS)
"""The `engine` values: pydantic puts the one a strategy matched into an error's path, which is not a key."""
_STRATEGY = TypeAdapter(Strategy)  # built once: building one takes milliseconds, and the TUI reads every second


def strategy_from_store(config: dict) -> DeepSpeedStrategy | FSDP2Strategy | TorchAOStrategy | None:
    """A strategy as a run store recorded it; None for one an older offloadlab wrote that no longer reads."""
    try:
        return _STRATEGY.validate_python(config)
    except ValidationError:
        return None


class RunSpec(_Strict):
    name: SafeName = "run"
    """Names the run's folder (runs/NAME-TIME by default): 1-64 letters, digits and . _ + -."""
    seed: int = Field(default=0, ge=0, lt=2**32)
    """Seeds the model's initial weights and the data. Within what numpy's generator takes (torch's takes
    more): the data's per-sample seeds, derived from it, stay within torch's 64 bits."""
    steps: int = Field(default=6, gt=0)
    """Optimizer steps each strategy trains."""
    seq_len: int = Field(default=64, gt=0)
    """Tokens a sample."""
    micro_batch: int = Field(default=2, gt=0)
    """Samples a micro-batch, per rank."""
    grad_accum: int = Field(default=1, gt=0)
    """Micro-batches per optimizer step per rank; effective batch = micro_batch * grad_accum * nproc."""
    global_batch_tokens: int | None = Field(default=None, gt=0)
    """Tokens per optimizer step over all ranks (seq_len * micro_batch * grad_accum * nproc). `offloadlab
    autotune` chooses micro_batch and grad_accum for each configuration it tries; `run` takes the given ones,
    or trains the whole batch as one micro-batch."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """The model's precision, the same for every strategy."""
    nproc: int = Field(default=1, gt=0)
    """Processes (GPUs) per strategy; > 1 launches through torchrun."""
    lr: float = Field(default=1e-3, gt=0)
    """AdamW's learning rate (betas 0.9 and 0.95, eps 1e-8)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW's weight decay."""
    grad_clip: float = Field(default=1.0, gt=0)
    """The gradients' global norm is clipped to this."""
    checkpoint_step: int = Field(default=0, ge=0)
    """Save after this step and verify the restore in a fresh process; 0 picks steps // 2, -1 is not allowed."""
    verify_checkpoint: bool = True
    """Restore the checkpoint saved after checkpoint_step in a fresh process, and check the whole state and
    the next step's loss against the uninterrupted run's."""
    telemetry_hz: float = Field(default=10.0, ge=0, le=100)
    """Sampler rate for GPU/host/disk figures; 0 turns the sampler off."""
    gpu_memory_limit_gib: float | None = Field(default=None, gt=0)
    """Hold each rank to a GPU of this many GiB (CUDA context and NCCL included), so one large GPU behaves
    like a smaller one; going past it is "does not fit". Not enforced on the CPU; `run --gpu-mem` sets it."""
    nvme_path: LaxPath | None = None
    """Where NVMe strategies swap; offloadlab makes (and removes) its own subfolder there."""
    model: ModelSpec
    """The [model] table."""
    data: DataSpec = DataSpec()
    """The [data] table; without it, synthetic tokens."""
    strategy: list[Strategy] = Field(min_length=1)
    """The strategies to compare, each a [[strategy]] table."""

    @model_validator(mode="before")
    @classmethod
    def _batch_from_tokens(cls, raw):
        """global_batch_tokens without micro_batch and grad_accum: the whole batch, one micro-batch a rank."""
        if not isinstance(raw, dict) or "micro_batch" in raw or "grad_accum" in raw:
            return raw
        tokens, seq_len, nproc = raw.get("global_batch_tokens"), raw.get("seq_len", 64), raw.get("nproc", 1)
        if all(type(v) is int and v > 0 for v in (tokens, seq_len, nproc)) and tokens % (seq_len * nproc) == 0:
            return {**raw, "micro_batch": tokens // (seq_len * nproc)}
        return raw

    @model_validator(mode="after")
    def _consistent(self) -> "RunSpec":
        if self.global_batch_tokens is not None and self.global_batch_tokens != self.tokens_per_step:
            rank_tokens = self.seq_len * self.nproc
            fix = (
                f"a multiple of seq_len * nproc = {rank_tokens}"
                if self.global_batch_tokens % rank_tokens
                else f"seq_len * micro_batch * grad_accum * nproc (now {self.tokens_per_step}), or leave micro_batch "
                "and grad_accum out"
            )
            raise ValueError(f"global_batch_tokens = {self.global_batch_tokens} must be {fix}")
        # Counted once: list.count per name made a spec of 30,000 strategies take 11 s to load.
        dupes = sorted(name for name, n in Counter(s.name for s in self.strategy).items() if n > 1)
        if dupes:
            raise ValueError(f"strategy names must be unique: {', '.join(dupes)}")
        if any(s.uses_nvme for s in self.strategy) and self.nvme_path is None:
            raise ValueError("a strategy offloads to nvme: set nvme_path to a folder on the NVMe drive")
        if self.grad_accum > 1 and any(getattr(s, "zenflow", None) for s in self.strategy):
            raise ValueError(
                "zenflow takes over DeepSpeed's gradient accumulation for its update_interval: set grad_accum = 1"
            )
        bf16_masters = [s.name for s in self.strategy if getattr(s, "bf16_master_weights", False)]
        if self.precision != "bf16" and bf16_masters:
            raise ValueError(
                f'{bf16_masters[0]}: bf16_master_weights keeps bf16 copies of a bf16 model: set precision = "bf16"'
            )
        one_gpu = [s.name for s in self.strategy if s.single_gpu]
        if one_gpu and self.nproc > 1:
            raise ValueError(
                f"{one_gpu[0]}: torchao's CPUOffloadOptimizer trains on one GPU: set nproc = 1, or use "
                'engine = "fsdp2" with cpu_offload = true to shard over several'
            )
        freeing = [s.name for s in self.strategy if getattr(s, "offload_gradients", False)]
        if self.grad_accum > 1 and freeing:
            raise ValueError(
                f"{freeing[0]}: offload_gradients frees each gradient before the next micro-batch adds to it: set "
                "grad_accum = 1, or offload_gradients = false"
            )
        if self.verify_checkpoint and self.steps < 2:
            raise ValueError("verify_checkpoint needs steps >= 2 (save at step k, compare step k+1)")
        if self.checkpoint_step >= self.steps:
            raise ValueError(f"checkpoint_step = {self.checkpoint_step} must be below steps = {self.steps}")
        return self

    @property
    def save_step(self) -> int:
        return self.checkpoint_step or max(1, self.steps // 2)

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.nproc

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.effective_batch

    def get_strategy(self, name: str) -> DeepSpeedStrategy | FSDP2Strategy | TorchAOStrategy:
        for s in self.strategy:
            if s.name == name:
                return s
        raise SpecError(f"no strategy named {name!r}; the spec has {', '.join(s.name for s in self.strategy)}")


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation such as list[Annotated[Union[A, B], ...]]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _allowed_keys(loc: tuple) -> list[str]:
    """The field names valid where an unknown key was found, to suggest the nearest."""
    models: list[type[BaseModel]] = [RunSpec]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        models = [
            m
            for model in models
            if part in model.model_fields
            for m in _models_in(model.model_fields[part].annotation)
        ]
    return sorted({name for model in models for name in model.model_fields})


# Keys other tools write that DeepSpeed 0.19.8 silently ignores; say what it reads instead.
_READ_INSTEAD = {"num_threads": "intra_op_parallelism"}


def _as_toml(value) -> str:
    """A value as the spec wrote it: `true`, `inf`, `"text"`."""
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if isinstance(value, str) else str(value)


def _hint(loc: tuple, full_loc: tuple) -> str:
    """What an unknown key may have meant: the key DeepSpeed reads instead, the engines that take it (a
    strategy's keys were suggested across engines: `ratio` on FSDP2 got "did you mean 'ratio'?"), or the
    nearest valid key."""
    unknown = str(loc[-1])
    if unknown in _READ_INSTEAD:
        return f" (did you mean {_READ_INSTEAD[unknown]!r}?)"
    engine = next((p for p in full_loc if p in ENGINE_TAGS), None)
    owners = [tag for tag, model in STRATEGY_MODELS.items() if tag != engine and unknown in model.model_fields]
    if engine and owners:
        takers = " and ".join(f'engine = "{o}"' for o in owners)
        return f' for engine = "{engine}": {takers} strategies take it'
    nearest = difflib.get_close_matches(unknown, _allowed_keys(loc), n=1)
    return f" (did you mean {nearest[0]!r}?)" if nearest else ""


def _format(err: ValidationError, source: str) -> str:
    """One line (the CLI's errors are): each problem as `key: what is wrong`, those of a value with the
    value given."""
    problems = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if p not in ENGINE_TAGS)
        key = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key{_hint(loc, e['loc'])}")
        elif e["type"] == "value_error" or not isinstance(e["input"], (bool, int, float, str)):
            problems.append(f"{key}: {e['msg'].removeprefix('Value error, ')}")
        else:
            problems.append(f"{key}: {e['msg']}, not {_as_toml(e['input'])}")
    return f"invalid run spec {source}: {'; '.join(problems)}"


def parse_spec(raw: dict, source: str = "<dict>") -> RunSpec:
    try:
        return RunSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(_format(err, source)) from None


def _read_toml(path: Path, what: str) -> dict:
    if not path.is_file():
        raise SpecError(f"{what} {path} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SpecError(f"{what} {path} cannot be read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{what} {path} is not UTF-8 text (byte {err.start}): save it as UTF-8, as TOML is") from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{what} {path} is not valid TOML: {err}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise SpecError(f"{what} {path} nests arrays or tables too deeply to read: no run spec is that deep") from None


def apply_tuned(strategy: dict, base: Path) -> dict:
    """Merge a `tuned = "file.toml"` fragment from `offloadlab tune` into a strategy table.

    The fragment's [aio] becomes the strategy's aio and its [swap_buffers] fill buffer fields; keys the
    strategy sets itself win.
    """
    if "tuned" not in strategy:
        return strategy
    strategy = dict(strategy)
    path = base / strategy.pop("tuned")
    fragment = _read_toml(path, f"strategy {strategy.get('name')!r}: tuned fragment")
    unknown = set(fragment) - {"aio", "swap_buffers", "measured"}
    if unknown:
        raise SpecError(f"tuned fragment {path}: unknown table(s) {', '.join(sorted(unknown))}")
    merged = {**fragment.get("swap_buffers", {}), **strategy}
    merged["aio"] = {**fragment.get("aio", {}), **strategy.get("aio", {})}
    measured = fragment.get("measured", {})
    if "read_gbps" in measured and "write_gbps" in measured:
        merged.setdefault("tuned_drive_gbps", [measured["read_gbps"], measured["write_gbps"]])
    return merged


# Keys holding paths, resolved against the spec's own folder (as `tuned` is), not the current directory.
_PATH_KEYS = ((), "nvme_path"), (("model",), "hf_model"), (("model",), "hf_config"), (("data",), "path")


def _resolve_paths(raw: dict, base: Path) -> dict:
    for tables, key in _PATH_KEYS:
        table = raw
        for name in tables:
            table = table.get(name) if isinstance(table, dict) else None
        if isinstance(table, dict) and isinstance(table.get(key), str):
            table[key] = str(base.absolute() / Path(table[key]).expanduser())  # an absolute path stays as is
    return raw


def load_spec(path: Path) -> RunSpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"run spec {path} does not exist; 'offloadlab init DIR' writes the shipped examples into DIR")
    raw = _resolve_paths(_read_toml(path, "run spec"), path.parent)
    if isinstance(raw.get("strategy"), list):
        raw["strategy"] = [apply_tuned(s, path.parent) if isinstance(s, dict) else s for s in raw["strategy"]]
    return parse_spec(raw, str(path))
