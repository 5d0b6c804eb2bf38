"""Bytes DeepSpeed's NVMe swappers move and the time the training waits for them, per step.

DeepSpeed 0.19.8 makes every swap handle through the loaded async_io op's `aio_handle` (the parameter
swapper and both optimizer swappers look it up when the engine is built), submits every read and write
through `async_pread`/`async_pwrite` (swap_tensor.utils) and blocks in `wait()`. Replacing the module's
`aio_handle` before the engine is built hands each swapper a handle that counts: bytes are exact (the
buffers submitted) and the wait is what the step spent on the drive that compute did not hide. Each
wait's span is kept (on the sampler's clock, as the phases are) so a step's wait can be split by phase.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class SwapTotals:
    read_bytes: int = 0
    write_bytes: int = 0
    wait_spans: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of each wait, time.time()."""

    def wait_by_phase(self, phases: list[tuple[str, float, float]]) -> dict[str, float]:
        """Seconds waited inside each kind of phase span (kind, start, end); a phase can repeat."""
        out: dict[str, float] = {}
        for kind, start, end in phases:
            inside = sum(max(0.0, min(end, w_end) - max(start, w_start)) for w_start, w_end in self.wait_spans)
            out[kind] = out.get(kind, 0.0) + inside
        return out

    @property
    def wait_seconds(self) -> float:
        return sum(end - start for start, end in self.wait_spans)


class MeteredHandle:
    """An aio handle that adds what passes through it to its meter; every other call goes to the handle."""

    def __init__(self, handle, meter: "SwapMeter"):
        self._handle, self._meter = handle, meter

    def async_pread(self, buffer, *args, **kwargs):
        self._meter._add(read_bytes=buffer.numel() * buffer.element_size())
        return self._handle.async_pread(buffer, *args, **kwargs)

    def async_pwrite(self, buffer, *args, **kwargs):
        self._meter._add(write_bytes=buffer.numel() * buffer.element_size())
        return self._handle.async_pwrite(buffer, *args, **kwargs)

    def wait(self):
        start = time.time()
        try:
            return self._handle.wait()
        finally:
            self._meter._add(wait_span=(start, time.time()))

    def __getattr__(self, name: str):
        return getattr(self._handle, name)


class SwapMeter:
    """Counts this process's NVMe swaps from `install()` on; `drain()` returns and resets the totals."""

    _installed: "SwapMeter | None" = None

    def __init__(self):
        self._totals = SwapTotals()
        self._lock = threading.Lock()

    @classmethod
    def install(cls) -> "SwapMeter":
        """Load the async_io op (through offloadlab's build lock) and meter the handles made from it."""
        from offloadlab.engines.ops import choose_deepspeed_accelerator, load_op

        if cls._installed is None:
            choose_deepspeed_accelerator()
            aio = load_op("async_io")
            make_handle = aio.aio_handle
            meter = cls()
            aio.aio_handle = lambda *args, **kwargs: MeteredHandle(make_handle(*args, **kwargs), meter)
            cls._installed = meter
        return cls._installed

    @classmethod
    def installed(cls) -> "SwapMeter | None":
        return cls._installed

    def _add(self, read_bytes: int = 0, write_bytes: int = 0, wait_span: tuple[float, float] | None = None) -> None:
        with self._lock:
            self._totals.read_bytes += read_bytes
            self._totals.write_bytes += write_bytes
            if wait_span is not None:
                self._totals.wait_spans.append(wait_span)

    def drain(self) -> SwapTotals:
        with self._lock:
            out, self._totals = self._totals, SwapTotals()
        return out
