"""The training loop of one strategy on one rank: steps, per-step figures, phase events, the checkpoint."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from offloadlab.engines.base import Engine
from offloadlab.results.figures import tokens_per_s
from offloadlab.results.steps import SWAP_EVENT
from offloadlab.results.store import RunStore, StepRecord
from offloadlab.spec import RunSpec
from offloadlab.telemetry import probes
from offloadlab.train.checkpoint import save_atomic
from offloadlab.train.comm_meter import CommMeter
from offloadlab.train.gpu_budget import GpuBudget
from offloadlab.train.swap_meter import SwapMeter
from offloadlab.workload.data import TokenSource


@dataclass(frozen=True)
class StepWindow:
    first: int
    last: int
    phase: str = "train"


@dataclass(frozen=True)
class Meters:
    """What a step's collectives and NVMe swaps moved and waited for (swap: None without NVMe)."""

    comm: CommMeter
    swap: SwapMeter | None

    def drain(self) -> None:
        self.comm.drain()
        if self.swap is not None:
            self.swap.drain()

    def events(self, step: int, t_start: float, t_end: float, phase: str, spans: list[tuple]) -> list[tuple]:
        """The step's events: one per kind of collective ("comm.all_gather"), and where it swaps, the bytes
        swapped and the time waited for them in all and inside each of the phase `spans`."""
        details = {f"comm.{kind}": asdict(totals) for kind, totals in self.comm.drain().items()}
        if self.swap is not None:
            swapped = self.swap.drain()
            details[SWAP_EVENT] = {
                "read_bytes": swapped.read_bytes,
                "write_bytes": swapped.write_bytes,
                "wait_seconds": swapped.wait_seconds,
                "wait_by_phase": swapped.wait_by_phase(spans),
            }
        return [(step, kind, t_start, t_end, json.dumps({**d, "phase": phase})) for kind, d in details.items()]


def run_steps(
    engine: Engine,
    spec: RunSpec,
    source: TokenSource,
    store: RunStore,
    strategy_id: int,
    window: StepWindow,
    checkpoint_root: Path | None = None,
    budget: GpuBudget | None = None,
) -> list[StepRecord]:
    """Train steps window.first..window.last (1-based, inclusive); save after spec.save_step if asked."""
    ctx = engine.ctx
    tokens_per_step = spec.effective_batch * spec.seq_len
    records = []
    meters = Meters(CommMeter.install(), SwapMeter.installed())
    meters.drain()  # what the engine's construction exchanged and swapped is not a step's
    for step in range(window.first, window.last + 1):
        batches = source.micro_batches(step - 1, ctx.rank, ctx.world_size, spec.micro_batch, spec.grad_accum)
        probes.reset_device_peaks()
        read_before, written_before = probes.process_io_bytes()
        t_start = time.time()
        loss = engine.train_step(batches)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        t_end = time.time()
        read_after, written_after = probes.process_io_bytes()
        memory = engine.memory_stats()
        record = StepRecord(
            step=step,
            loss=loss,
            t_start=t_start,
            t_end=t_end,
            tokens_per_s=tokens_per_s(tokens_per_step, t_end - t_start),
            peak_allocated_bytes=memory.peak_allocated_bytes,
            peak_reserved_bytes=memory.peak_reserved_bytes,
            peak_active_bytes=memory.peak_active_bytes,
            host_rss_peak_bytes=probes.host_rss_peak_bytes(),
            disk_read_bytes=read_after - read_before,
            disk_write_bytes=written_after - written_before,
            phase=window.phase,
        )
        store.add_step(strategy_id, ctx.rank, record)
        spans = engine.phase.drain()
        store.add_events(
            strategy_id,
            ctx.rank,
            [(step, kind, t0, t1, None) for kind, t0, t1 in spans]
            + meters.events(step, t_start, t_end, window.phase, spans),
        )
        records.append(record)
        if budget and step == window.first:
            budget.apply()  # the first step's cuBLAS handles and workspaces live outside the allocator too
        if checkpoint_root is not None and step == spec.save_step:
            t0 = time.time()
            save_atomic(engine, checkpoint_root, step, partial(store.record_checkpoint_files, strategy_id))
            store.add_events(strategy_id, ctx.rank, [(step, "checkpoint_save", t0, time.time(), str(checkpoint_root))])
            meters.drain()  # the save's gathers and swaps are not the next step's
    return records
