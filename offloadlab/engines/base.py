"""The one interface both engine adapters implement, and what they share: the process group, the loss,
phase timing and state digests."""

from __future__ import annotations

import hashlib
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from offloadlab.workload.data import Batch
from offloadlab.telemetry.probes import DeviceMemory, device_memory


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @classmethod
    def from_env(cls) -> "DistContext":
        """Read torchrun's variables; pick this rank's GPU, or the CPU where there is none."""
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), local_rank, device)

    @property
    def backend(self) -> str:
        # CPU-offloaded FSDP2 gradients are clipped on the CPU, so a GPU run needs gloo beside NCCL.
        return "cuda:nccl,cpu:gloo" if self.device.type == "cuda" else "gloo"


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


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def global_mean(value: float, ctx: DistContext) -> float:
    """The mean over ranks of a per-rank scalar (gloo has no AVG, so sum and divide)."""
    if ctx.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.item() / ctx.world_size


DIGEST_CHUNK_BYTES = 16 << 20


def tensor_digest(tensor: torch.Tensor, after_chunk: Callable[[np.ndarray], None] | None = None) -> str:
    """sha256 of dtype, shape and bytes, fed in chunks; `after_chunk` sees each chunk once it is hashed
    (a mapped file's pages can be dropped there, so a flat group of GBs is never resident at once)."""
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    data = t.numpy().reshape(-1).view(np.uint8)  # the buffer itself: tobytes() would copy it
    for start in range(0, data.size, DIGEST_CHUNK_BYTES):
        chunk = data[start:start + DIGEST_CHUNK_BYTES]
        h.update(chunk)
        if after_chunk is not None:
            after_chunk(chunk)
    return h.hexdigest()[:16]


def digest_tree(obj, prefix: str, out: dict[str, str],
                digest: Callable[[torch.Tensor], str] = tensor_digest) -> dict[str, str]:
    """Flatten nested state into {path: digest}; tensors by content (through `digest`, one at a time, so
    an engine can gather or page in each tensor only while it is hashed), other leaves by value."""
    if isinstance(obj, torch.Tensor):
        out[prefix] = digest(obj)
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            digest_tree(obj[key], f"{prefix}/{key}", out, digest)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            digest_tree(item, f"{prefix}/{i}", out, digest)
    elif isinstance(obj, (int, float, str, bool, type(None))):
        out[prefix] = repr(obj)
    elif hasattr(obj, "__dict__"):
        digest_tree(vars(obj), f"{prefix}/{type(obj).__name__}", out, digest)
    else:
        out[prefix] = repr(obj)
    return out


class Engine(ABC):
    """A built, ready-to-train strategy. All methods are collective: every rank calls them."""

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

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
