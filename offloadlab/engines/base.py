"""The one interface both engine adapters implement: training, checkpoints and digests (on a built engine),
and what the parent process asks of an engine before any is built (capabilities, on the class)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from offloadlab.engines.dist import DistContext
from offloadlab.results.status import Status
from offloadlab.telemetry.probes import DeviceMemory, device_memory
from offloadlab.workload.data import Batch


@dataclass
class PhaseTimer:
    """Wall-clock spans of forward/backward/optimizer inside one step, on the sampler's clock (time.time)."""

    spans: list[tuple[str, float, float]] = field(default_factory=list)

    @contextmanager
    def __call__(self, kind: str):
        start = time.time()
        try:
            yield
        finally:
            self.spans.append((kind, start, time.time()))

    def drain(self) -> list[tuple[str, float, float]]:
        spans, self.spans = self.spans, []
        return spans


class Engine(ABC):
    """A built, ready-to-train strategy. Its methods are collective: every rank calls them. What the parent
    process asks before any engine is built is the engine's planner's and its registry record's (torch's
    distributed packages and the engine's library are not imported there)."""

    @classmethod
    @abstractmethod
    def build(cls, spec, strategy, ctx: DistContext, nvme_dir: Path | None) -> "Engine":
        """Build the strategy's engine on this rank (collective)."""

    @classmethod
    def failure_reason(cls, exc: BaseException) -> tuple[Status, str] | None:
        """How the engine reads one of its own errors (its messages), or None when it says nothing more
        than the error's type (out of memory, disk full: see train.worker.classify_failure)."""
        return None

    def __init__(self, ctx: DistContext):
        self.ctx = ctx
        self.phase = PhaseTimer()

    @property
    @abstractmethod
    def module(self) -> torch.nn.Module:
        """The model being trained (sharded or partitioned in place)."""

    @abstractmethod
    def train_step(self, batches: list[Batch]) -> float:
        """One optimizer step over `batches` (this rank's micro-batches); returns the mean loss over all ranks."""

    @abstractmethod
    def save(self, folder: Path, step: int) -> None:
        """Write model, optimizer and progress state into `folder` (which exists)."""

    @abstractmethod
    def load(self, folder: Path) -> int:
        """Restore what `save` wrote; returns the step it was saved after."""

    @abstractmethod
    def state_digest(self, scratch: Path, saved: Path | None) -> dict[str, str]:
        """Digests of the full training state. `saved`: a folder `save` just wrote for this state, if any;
        `scratch`: an empty folder the engine may write into."""

    def memory_stats(self) -> DeviceMemory:
        return device_memory()

    def pinned_swap_bytes(self) -> int:
        """Page-locked host bytes held for NVMe swapping (none but DeepSpeed's NVMe placements)."""
        return 0

    def tensors_on_nvme(self) -> tuple[int, int] | None:
        """(parameters, optimizer sub-groups) kept on NVMe on this rank; None where nothing is offloaded there."""
        return None

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def build_engine(spec, strategy, ctx: DistContext, nvme_dir: Path | None) -> Engine:
    """The strategy's engine, built on this rank (collective)."""
    from offloadlab.engines import engine_for

    return engine_for(strategy).adapter().build(spec, strategy, ctx, nvme_dir)
