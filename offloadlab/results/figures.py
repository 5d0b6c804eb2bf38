"""The arithmetic of a run's figures: tokens/s, model FLOPs and MFU, the steady steps and their medians.
Plain numbers in, plain numbers out (no torch), so the planner, the trainer and every reader share it."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

# Dense peak TFLOP/s per GPU (no sparsity) by precision, from the vendors' datasheets. MFU divides achieved
# model FLOP/s by these; a GPU missing here reports no MFU rather than a guessed one.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp32": 67.0},
    "H100": {"bf16": 989.0, "fp32": 67.0},  # SXM; the PCIe card is 756 / 51
    "A100": {"bf16": 312.0, "fp32": 19.5},
    "L40S": {"bf16": 362.0, "fp32": 91.6},
    "A10G": {"bf16": 125.0, "fp32": 31.2},
    "RTX 4090": {"bf16": 165.2, "fp32": 82.6},
}


def tokens_per_s(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def peak_tflops(device_name: str, precision: str) -> float | None:
    for key, table in PEAK_TFLOPS.items():
        if key in device_name:
            return table[precision]
    return None


def flops_per_token(n_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the dense matmuls plus 12*L*d*s for attention (PaLM appendix B).

    Model FLOPs: activation checkpointing's recomputed forward is not counted, as in torchtitan's MFU.
    """
    return 6.0 * n_params + 12.0 * n_layers * d_model * seq_len


MODEL_FACTS_EVENT = "model"
RANK_PROCESS_EVENT = "rank_process"
LAUNCH_EVENT = "launch"
"""Recorded by `offloadlab run` as it starts a strategy's ranks: a token, handed to them in LAUNCH_TOKEN_ENV
(not in the command its log shows), that a rank must hold to record anything."""
LAUNCH_TOKEN_ENV = "OFFLOADLAB_LAUNCH_TOKEN"


@dataclass(frozen=True)
class RankProcess:
    """Where one rank runs, recorded by the rank as it starts: what the TUI's ranks view looks up."""

    pid: int
    host: str
    local_rank: int
    device: str
    """torch's name for the rank's device: "cuda:1", or "cpu"."""
    cpu_cores: tuple[int, ...]
    """The CPU ids the rank is bound to."""
    mode: str = "train"
    """What the launch does: train, or verify (restore the checkpoint in fresh ranks and check it)."""


def swapped_nothing(tensors_on_nvme) -> bool:
    """Asked to offload to NVMe, the engine put no tensor there: DeepSpeed keeps tensors under 1 MiB and the
    parameters its max_in_cpu buffer holds in RAM. tensors_on_nvme: (parameters, optimizer sub-groups)."""
    return tensors_on_nvme is not None and not any(tensors_on_nvme)


@dataclass(frozen=True)
class ModelFacts:
    """What MFU needs about a strategy's run, recorded once by rank 0 after the engine is built."""

    n_params: int
    n_layers: int
    d_model: int
    seq_len: int
    precision: str
    device_name: str
    world_size: int
    pinned_swap_bytes: int = 0
    """Rank 0's page-locked NVMe swap buffers (DeepSpeed's parameter and optimizer swappers)."""
    gpu_memory_bytes: int | None = None
    """Rank 0's GPU's memory (None on the CPU), what its peaks are held against."""
    host_memory_bytes: int | None = None
    """The host's RAM, what the process tree's RSS is held against."""
    gpu_budget_bytes: int | None = None
    """The GPU memory budget the run was held to (`gpu_memory_limit_gib`); None: the whole GPU."""
    cpu_cores: tuple[int, ...] = ()
    """The CPU ids rank 0 was bound to (one a physical core), where its CPU optimizer ran."""
    cpu_threads: int | None = None
    """The threads of rank 0's torch and OpenMP pools (its CPU optimizer's)."""
    tensors_on_nvme: tuple[int, int] | None = None
    """(parameters, optimizer sub-groups) rank 0 kept on NVMe; None: nothing was offloaded to NVMe."""

    @classmethod
    def first_of(cls, events: list) -> "ModelFacts | None":
        """The facts in a strategy's MODEL_FACTS_EVENT rows (recorded once); None before its engine was built."""
        return cls(**json.loads(events[0]["detail"])) if events else None

    @property
    def swapped_nothing(self) -> bool:
        return swapped_nothing(self.tensors_on_nvme)

    @property
    def gpu_capacity_bytes(self) -> int | None:
        """What the GPU peaks are held against: the budget where there was one, else the GPU's memory."""
        return self.gpu_budget_bytes or self.gpu_memory_bytes

    @property
    def flops_per_token(self) -> float:
        return flops_per_token(self.n_params, self.n_layers, self.d_model, self.seq_len)


def mfu_percent(tokens_per_s: float, facts: ModelFacts) -> float | None:
    """Achieved model FLOP/s per GPU over the dense peak of PEAK_TFLOPS; None for a device not in the table."""
    peak = peak_tflops(facts.device_name, facts.precision)
    if peak is None:
        return None
    return 100.0 * tokens_per_s / facts.world_size * facts.flops_per_token / (peak * 1e12)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# A step this many times the median is a stall: ZenFlow's CPU catching up, a swap that waited, a GC pause.
STALL_FACTOR = 3.0


@dataclass(frozen=True)
class StepTimes:
    """What a median step hides: throughput over the whole time of the steady steps, the spread, stalls."""

    tokens_per_s: float
    """Tokens over seconds, all steady steps together: a 16 s step every 14 counts in full."""
    mean_s: float
    """Seconds over steps: the step a throughput figure implies."""
    p50_s: float
    p90_s: float
    max_s: float
    stalls: int
    """Steps over STALL_FACTOR times the median."""

    @classmethod
    def of_steps(cls, steps: list) -> "StepTimes | None":
        """Of step records (the store's StepRecord): each one's seconds, and tokens at its own rate."""
        return cls.of([r.step_time_s for r in steps], [r.tokens_per_s * r.step_time_s for r in steps])

    @classmethod
    def of(cls, seconds: list[float], tokens: list[float]) -> "StepTimes | None":
        if not seconds or sum(seconds) <= 0:
            return None
        p50 = percentile(seconds, 0.5)
        return cls(
            tokens_per_s=sum(tokens) / sum(seconds),
            mean_s=sum(seconds) / len(seconds),
            p50_s=p50,
            p90_s=percentile(seconds, 0.9),
            max_s=max(seconds),
            stalls=sum(1 for s in seconds if s > STALL_FACTOR * p50),
        )


def practicality(tokens_per_s: float | None, without_offload_tokens_per_s: float | None) -> float | None:
    """Throughput as a share of the same model's without offload (ZenFlow's paper calls it practicality)."""
    if not tokens_per_s or not without_offload_tokens_per_s:
        return None
    return tokens_per_s / without_offload_tokens_per_s


def relative_deviation(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return (value - reference) / abs(reference)


def steady_state(values: list[float]) -> list[float]:
    """Drop the first step (allocator warm-up, JIT, first swap-in) when there are enough steps left."""
    return values[1:] if len(values) > 2 else values
