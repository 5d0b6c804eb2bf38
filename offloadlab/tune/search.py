"""`offloadlab tune --nvme PATH`: find the aio settings that make ZeRO-Infinity's swapping fastest.

Search: a coarse grid over block size x queue depth x threads x single_submit, then rounds of refinement
around the best points (each axis halved and doubled, booleans flipped) until a round brings nothing better,
then repeats of the leaders until their spread is small. `ds_nvme_tune` instead starts one process per
point of a fixed grid, for reads and writes apart.

Objective: the time to move one byte of the workload's mix, i.e. the harmonic mean
    score = 1 / (read_share / read_GBps + (1 - read_share) / write_GBps)
where read_share comes from the workload (see `READ_SHARE`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from offloadlab.checks.host import (
    PreflightError,
    check_aio_contexts,
    check_direct_io,
    check_directory,
    check_free_disk,
    check_pinned_memory,
)
from offloadlab.engines.ops import Announce, load_op
from offloadlab.measure.aio_bench import DEEPSPEED_DEFAULT, AioBench, Throughput, measure_direct_io_baseline
from offloadlab.measure.links import PcieSpeed, measure_pinned_copy
from offloadlab.results.rundir import signals_ignored
from offloadlab.results.store import TunePoint
from offloadlab.spec import AioSettings

# Share of swap bytes that are reads, per step. Parameters (16-bit): read in forward and again in
# backward, written once after the step -> 2/3. Optimizer (fp32 master, Adam m and v, gradient): read
# once and written once -> 1/2. Both: by bytes, 2*2P + 16P read vs 2P + 16P written.
READ_SHARE = {"param": 2 / 3, "optimizer": 1 / 2, "both": (4 + 16) / (4 + 16 + 2 + 16)}

WORK_PREFIX = "offloadlab-tune-"
KiB, MiB = 1024, 1024 * 1024


@dataclass(frozen=True)
class TuneSettings:
    io_size: int
    coarse_block_sizes: tuple[int, ...]
    coarse_queue_depths: tuple[int, ...]
    coarse_threads: tuple[int, ...]
    max_rounds: int
    leaders: int
    min_repeats: int
    max_repeats: int
    target_spread: float
    """Stop repeating a point when (max - min) / mean of its scores is below this."""

    def coarse_points(self) -> list[AioSettings]:
        # single_submit is on the grid, not left to refinement: on a virtio disk ds_nvme_tune's best point
        # had it on at qd 128, a region refinement from the best single_submit=False points never reached.
        return [
            AioSettings(block_size=b, queue_depth=q, intra_op_parallelism=t, single_submit=single)
            for b, q, t, single in itertools.product(
                self.coarse_block_sizes, self.coarse_queue_depths, self.coarse_threads, (False, True)
            )
        ]

    @classmethod
    def for_mode(cls, quick: bool) -> "TuneSettings":
        threads = tuple(t for t in (1, 2, 4, 8) if t <= max(2, os.cpu_count() or 1))
        if quick:
            return cls(
                io_size=64 * MiB,
                coarse_block_sizes=(256 * KiB, 1 * MiB, 8 * MiB),
                coarse_queue_depths=(8, 32, 128),
                coarse_threads=(threads[0], threads[-1]),
                max_rounds=2,
                leaders=2,
                min_repeats=2,
                max_repeats=3,
                target_spread=0.10,
            )
        return cls(
            io_size=512 * MiB,
            coarse_block_sizes=(256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB),
            coarse_queue_depths=(8, 32, 128),
            coarse_threads=(1, threads[-1]),
            max_rounds=4,
            leaders=3,
            min_repeats=3,
            max_repeats=6,
            target_spread=0.05,
        )


@dataclass
class PointResult:
    point: AioSettings
    stage: str
    samples: list[Throughput] = field(default_factory=list)

    def _mean(self, attr: str) -> float:
        return statistics.mean(getattr(s, attr) for s in self.samples)

    def _spread(self, attr: str) -> float:
        values = [getattr(s, attr) for s in self.samples]
        return (max(values) - min(values)) / statistics.mean(values) if len(values) > 1 else 0.0

    @property
    def read_gbps(self) -> float:
        return self._mean("read_gbps")

    @property
    def write_gbps(self) -> float:
        return self._mean("write_gbps")

    @property
    def read_spread(self) -> float:
        return self._spread("read_gbps")

    @property
    def write_spread(self) -> float:
        return self._spread("write_gbps")

    def score(self, read_share: float) -> float:
        return mixed_score(self.read_gbps, self.write_gbps, read_share)

    def record(self, read_share: float, is_best: bool = False) -> TunePoint:
        """What the run store keeps of this point (and `tune --json` prints)."""
        return TunePoint(
            self.point,
            self.stage,
            self.read_gbps,
            self.read_spread,
            self.write_gbps,
            self.write_spread,
            len(self.samples),
            self.score(read_share),
            is_best,
            self.point == DEEPSPEED_DEFAULT,
        )


def mixed_score(read_gbps: float, write_gbps: float, read_share: float) -> float:
    return 1.0 / (read_share / read_gbps + (1.0 - read_share) / write_gbps)


@dataclass
class TuneResult:
    path: Path
    workload: str
    read_share: float
    results: list[PointResult]
    best: PointResult
    default: PointResult
    direct_io: Throughput
    pcie: PcieSpeed | None
    """The pinned buffer -> GPU copy a swap-in ends with; None without a GPU."""
    seconds: float
    measurements: int

    def records(self) -> list[TunePoint]:
        return [r.record(self.read_share, r is self.best) for r in self.results]


def _settings_order(point: AioSettings) -> tuple:
    """Refinement measures new points in a fixed order, so two sweeps of one drive are comparable."""
    return tuple(point.model_dump().values())


def neighbours(point: AioSettings, max_threads: int) -> list[AioSettings]:
    """Each axis halved and doubled within sane bounds, and each boolean flipped."""
    out = []
    for factor in (0.5, 2):
        block = int(point.block_size * factor)
        if 128 * KiB <= block <= 16 * MiB:
            out.append(point.with_(block_size=block))
        depth = int(point.queue_depth * factor)
        if 2 <= depth <= 256:
            out.append(point.with_(queue_depth=depth))
        threads = int(point.intra_op_parallelism * factor)
        if 1 <= threads <= max_threads:
            out.append(point.with_(intra_op_parallelism=threads))
    out.append(point.with_(single_submit=not point.single_submit))
    out.append(point.with_(overlap_events=not point.overlap_events))
    return out


class Tuner:
    def __init__(
        self,
        path: Path,
        workload: str,
        settings: TuneSettings,
        on_progress: Callable[[str, PointResult | None, int, int], None] | None = None,
        announce_build: Announce | None = None,
    ):
        if workload not in READ_SHARE:
            raise PreflightError(f"workload {workload!r} is unknown: use one of {', '.join(READ_SHARE)}")
        self.path, self.workload, self.settings = path, workload, settings
        self.read_share = READ_SHARE[workload]
        self.on_progress = on_progress or (lambda *_: None)
        self.announce_build = announce_build
        self.results: dict[AioSettings, PointResult] = {}
        self.measurements = 0
        self.work_dir: Path | None = None
        self.checked = False

    def preflight(self) -> None:
        """Checks the drive and loads the aio op; the CLI calls it before it makes any file."""
        # Two probe files of io_size live at once (aio and the O_DIRECT baseline), never together with
        # more; keep a margin so the drive is never filled.
        needed = 2 * self.settings.io_size + 256 * MiB
        check_directory(self.path, "--nvme")
        check_direct_io(self.path, "--nvme", needed)
        check_free_disk(self.path, needed, "--nvme")
        load_op("async_io", self.announce_build)  # loaded before any timing: a first-use build is never timed as I/O
        check_pinned_memory(self.settings.io_size)
        # The largest point: 256 queued events for each of 8 threads.
        check_aio_contexts(256 * max(self.settings.coarse_threads) * 2)
        self.checked = True

    def run(self) -> TuneResult:
        if not self.checked:
            self.preflight()
        start = time.perf_counter()
        self.work_dir = self.path / f"{WORK_PREFIX}{uuid.uuid4().hex[:8]}"
        self.work_dir.mkdir()
        try:
            return self._sweep(start)
        finally:
            with signals_ignored():  # a second Ctrl-C does not leave the probe files behind
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def _sweep(self, start: float) -> TuneResult:
        s = self.settings
        bench = AioBench(self.work_dir, s.io_size)
        try:
            direct_io = measure_direct_io_baseline(self.work_dir, s.io_size)
            max_threads = max(s.coarse_threads)
            self._measure_all(bench, s.coarse_points() + [DEEPSPEED_DEFAULT], "coarse")
            for round_no in range(1, s.max_rounds + 1):
                best_before = self._ranked()[0]
                candidates = {n for r in self._ranked()[: s.leaders] for n in neighbours(r.point, max_threads)}
                new = sorted((p for p in candidates if p not in self.results), key=_settings_order)
                if not new:
                    break
                self._measure_all(bench, new, f"refine {round_no}")
                if self._ranked()[0] is best_before:
                    break
            default = self.results[DEEPSPEED_DEFAULT]
            while len(default.samples) < s.min_repeats:
                self._measure(bench, default, "repeat")
            self._repeat_leaders(bench)
        finally:
            bench.close()
        return TuneResult(
            self.path,
            self.workload,
            self.read_share,
            self._ranked(),
            self._ranked()[0],
            self.results[DEEPSPEED_DEFAULT],
            direct_io,
            measure_pinned_copy(),
            time.perf_counter() - start,
            self.measurements,
        )

    def _ranked(self) -> list[PointResult]:
        return sorted(self.results.values(), key=lambda r: r.score(self.read_share), reverse=True)

    def _measure_all(self, bench: AioBench, points: list[AioSettings], stage: str) -> None:
        for point in points:
            if point not in self.results:
                self.results[point] = PointResult(point, stage)
                self._measure(bench, self.results[point], stage)

    def _measure(self, bench: AioBench, result: PointResult, stage: str) -> None:
        result.samples.append(bench.measure(result.point))
        self.measurements += 1
        self.on_progress(stage, result, self.measurements, self._expected_total())

    def _repeat_leaders(self, bench: AioBench) -> None:
        """Repeat the leading points until each has min_repeats and a small spread (or max_repeats).

        Repeats move means, so a point measured once can rise into the lead: the leaders are re-read
        after every measurement, and the loop ends only when the current ones are settled.
        """
        s = self.settings
        while True:
            unsettled = [
                r
                for r in self._ranked()[: s.leaders]
                if len(r.samples) < s.max_repeats
                and (len(r.samples) < s.min_repeats or max(r.read_spread, r.write_spread) > s.target_spread)
            ]
            if not unsettled:
                return
            self._measure(bench, unsettled[0], "repeat")

    def _expected_total(self) -> int:
        s = self.settings
        coarse = len(s.coarse_points()) + 1
        return max(self.measurements, coarse + 10 * s.leaders * s.max_rounds // 2 + s.leaders * s.min_repeats)
