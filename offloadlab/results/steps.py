"""Per-step figures derived from the sampler's series and the steps' start/end times (same clock)."""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

from offloadlab.results.store import RunStore, StepRecord


@dataclass(frozen=True)
class StepTelemetry:
    gpu_idle_share: float | None
    """1 - mean GPU utilization over the step's samples (all GPUs)."""
    device_read_bytes: float | None
    """Bytes the nvme_path's block device read during the step (whole device, all processes)."""
    device_write_bytes: float | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None


class CumulativeSeries:
    """A counter rebuilt from per-sample deltas, read at any time by linear interpolation."""

    def __init__(self, rows: list[tuple[float, str, float | None]]):
        self.t, self.total = [], []
        running = 0.0
        for t, _, value in rows:
            running += value or 0.0
            self.t.append(t)
            self.total.append(running)

    def at(self, t: float) -> float:
        i = bisect.bisect_left(self.t, t)
        if i == 0:
            return 0.0
        if i == len(self.t):
            return self.total[-1]
        t0, t1 = self.t[i - 1], self.t[i]
        # The delta at t[i] accrued over (t[i-1], t[i]]: spread it evenly.
        return self.total[i - 1] + (self.total[i] - self.total[i - 1]) * (t - t0) / (t1 - t0)

    def between(self, start: float, end: float) -> float | None:
        return self.at(end) - self.at(start) if self.t else None


class SampledSeries:
    """A gauge's samples with their times split out once, so each step's window is two bisections (the
    times used to be rebuilt for every step: quadratic in a run's length)."""

    def __init__(self, rows: list[tuple[float, str, float | None]]):
        self.t = [r[0] for r in rows]
        self.values = [r[2] for r in rows]

    def mean_in(self, start: float, end: float) -> float | None:
        """Mean of the values sampled in [start, end]; the nearest sample when the step was shorter than a
        period."""
        lo, hi = bisect.bisect_left(self.t, start), bisect.bisect_right(self.t, end)
        window = [v for v in self.values[lo:hi] if v is not None]
        if not window and self.t:
            middle = (start + end) / 2
            i = bisect.bisect_left(self.t, middle)
            nearest = min((j for j in (i - 1, i) if 0 <= j < len(self.t)), key=lambda j: abs(self.t[j] - middle))
            window = [self.values[nearest]] if self.values[nearest] is not None else []
        return statistics.fmean(window) if window else None


def per_step(store: RunStore, strategy_id: int, steps: list[StepRecord]) -> list[StepTelemetry]:
    util = SampledSeries(store.samples(strategy_id, "gpu%.util(%)"))
    tx = SampledSeries(store.samples(strategy_id, "gpu%.pcie_tx(B/s)"))
    rx = SampledSeries(store.samples(strategy_id, "gpu%.pcie_rx(B/s)"))
    read = CumulativeSeries(store.samples(strategy_id, "disk.read_bytes(B)"))
    written = CumulativeSeries(store.samples(strategy_id, "disk.write_bytes(B)"))
    out = []
    for s in steps:
        mean_util = util.mean_in(s.t_start, s.t_end)
        out.append(
            StepTelemetry(
                gpu_idle_share=None if mean_util is None else 1.0 - mean_util / 100.0,
                device_read_bytes=read.between(s.t_start, s.t_end),
                device_write_bytes=written.between(s.t_start, s.t_end),
                pcie_tx_bytes_per_s=tx.mean_in(s.t_start, s.t_end),
                pcie_rx_bytes_per_s=rx.mean_in(s.t_start, s.t_end),
            )
        )
    return out
