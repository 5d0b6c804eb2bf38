"""Bytes and time of the collectives a rank issues, per kind, per step.

Both engines reach the process group through `torch.distributed`'s module functions (FSDP2 calls
`dist.all_gather_single`/`reduce_scatter_single` at each use; DeepSpeed's TorchBackend looks its
functions up when the engine is built), so wrapping those functions once, before the engine is built,
sees every collective. Bytes are exact: the gathered output, the scattered input, the reduced tensor.
Time is what the call blocks for: an async collective's wait happens elsewhere, so for those it is a
lower bound.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

# function name -> (kind, which argument's bytes count: an index into args or a keyword)
COLLECTIVES: dict[str, tuple[str, int, str]] = {
    "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
    "all_gather_single": ("all_gather", 0, "output_tensor"),
    "_all_gather_base": ("all_gather", 0, "output_tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
    "reduce_scatter_single": ("reduce_scatter", 1, "input"),
    "_reduce_scatter_base": ("reduce_scatter", 1, "input"),
    "all_reduce": ("all_reduce", 0, "tensor"),
    "broadcast": ("broadcast", 0, "tensor"),
}


@dataclass
class CommTotals:
    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class CommMeter:
    """Counts this process's collectives from `install()` on; `drain()` returns and resets the totals."""

    _installed: "CommMeter | None" = None

    def __init__(self):
        self._totals: dict[str, CommTotals] = {}
        self._lock = threading.Lock()

    @classmethod
    def install(cls) -> "CommMeter":
        if cls._installed is None:
            meter = cls()
            for name, (kind, index, keyword) in COLLECTIVES.items():
                original = getattr(dist, name, None)
                if original is not None:
                    setattr(dist, name, meter._wrap(original, kind, index, keyword))
            cls._installed = meter
        return cls._installed

    def _wrap(self, fn, kind: str, index: int, keyword: str):
        @functools.wraps(fn)
        def metered(*args, **kwargs):
            tensor = args[index] if len(args) > index else kwargs.get(keyword)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._add(kind, _tensor_bytes(tensor), time.perf_counter() - start)

        return metered

    def _add(self, kind: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            totals = self._totals.setdefault(kind, CommTotals())
            totals.calls += 1
            totals.bytes += nbytes
            totals.seconds += seconds

    def drain(self) -> dict[str, CommTotals]:
        with self._lock:
            out, self._totals = self._totals, {}
        return out
