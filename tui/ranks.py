"""The GPUs and ranks view's data: each GPU's newest sample and each rank as a process (PID, RSS, CPU), as
nvitop shows them. GPU figures come from the run store (the sampler's NVML fields); a rank's process is
looked up by the PID it recorded as it started, on this host only, and only while it is that process."""

from __future__ import annotations

import json
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil

from offloadlab.results.figures import MODEL_FACTS_EVENT, RANK_PROCESS_EVENT, ModelFacts, RankProcess
from offloadlab.results.status import Status
from offloadlab.results.steps import TELEMETRY_NOTE
from offloadlab.results.store import RunStore
from offloadlab.results.summary import status_of

from .reader import read_store

GPU_METRIC = re.compile(r"gpu(\d+)\.(.+)")
NEWEST_S = 2.0
"""A GPU's figures are its samples of the last this many seconds before the strategy's newest sample."""


@dataclass(frozen=True)
class GpuRow:
    index: int
    fields: dict[str, float]
    """The sampler's GPU fields (util(%), mem_used(B), pcie_tx(B/s), ...) by name; a field the GPU did
    not give is absent."""
    memory_total_bytes: int | None


@dataclass(frozen=True)
class RankRow:
    rank: int
    process: RankProcess
    state: str
    """"running", "exited", or "on HOST" (another host's process cannot be looked at from here)."""
    rss_bytes: int | None
    cpu_percent: float | None
    """100% a core; None on the first look (psutil measures CPU between two looks)."""


@dataclass(frozen=True)
class RanksView:
    run_dir: Path
    strategy: str
    status: Status
    gpus: list[GpuRow]
    ranks: list[RankRow]
    gpu_note: str | None
    """Why there are no GPU rows (the sampler's note), if there are none."""


class RanksReader:
    """The running strategy's GPUs and ranks (else the last that started), read each poll; the processes
    are kept between polls so that their CPU share is measured over the poll."""

    def __init__(self, run_dir: Path, stop: threading.Event | None = None):
        self.run_dir, self.stop = Path(run_dir), stop
        self._processes: dict[tuple[int, float], psutil.Process] = {}

    def read(self) -> RanksView | None:
        return read_store(self.run_dir, self._read, self.stop)

    def _read(self, store: RunStore) -> RanksView | None:
        rows = store.strategies(store.run()["id"])
        started = [r for r in rows if Status(r["status"]) is not Status.PENDING]
        if not started:
            return None
        row = next((r for r in started if Status(r["status"]) is Status.RUNNING), started[-1])
        status, _ = status_of(row, store.run_status() is Status.INTERRUPTED)  # as the dashboard shows it
        # The sampler's (of no rank): a query by kind over every rank's events read a day of them each poll.
        notes = [e["detail"] for e in store.events_of_rank(row["id"], TELEMETRY_NOTE, None)]
        gpu_note = next((n for n in notes if n.startswith("GPU fields absent")), None)
        return RanksView(
            self.run_dir,
            row["name"],
            status,
            _gpus(store, row["id"]),
            self._ranks(store, row["id"]),
            gpu_note,
        )

    def _ranks(self, store: RunStore, strategy_id: int) -> list[RankRow]:
        newest: dict[int, tuple[float, RankProcess]] = {}
        for event in store.events(strategy_id, RANK_PROCESS_EVENT):  # by time: a verify's restart replaces
            newest[event["rank"]] = (event["t_start"], RankProcess(**json.loads(event["detail"])))
        return [self._row(rank, t, process) for rank, (t, process) in sorted(newest.items())]

    def _row(self, rank: int, recorded_at: float, process: RankProcess) -> RankRow:
        if process.host != socket.gethostname():
            return RankRow(rank, process, f"on {process.host}", None, None)
        key = (process.pid, recorded_at)
        try:
            proc = self._processes.get(key) or psutil.Process(process.pid)
            # A PID the kernel has given to a later process is not the rank's.
            if proc.create_time() > recorded_at + 1.0:
                raise psutil.NoSuchProcess(process.pid)
            first_look = key not in self._processes
            self._processes[key] = proc
            with proc.oneshot():
                rss, cpu = proc.memory_info().rss, proc.cpu_percent(None)
        except psutil.Error:
            self._processes.pop(key, None)
            return RankRow(rank, process, "exited", None, None)
        return RankRow(rank, process, "running", rss, None if first_look else cpu)


def _gpus(store: RunStore, strategy_id: int) -> list[GpuRow]:
    newest = store.newest_sample_t(strategy_id)
    fields: dict[int, dict[str, float]] = {}
    for _, metric, value in store.samples(strategy_id, "gpu%", after_t=newest - NEWEST_S):
        match = GPU_METRIC.fullmatch(metric)
        if match and value is not None:
            fields.setdefault(int(match[1]), {})[match[2]] = value  # by time: the newest is kept
    facts = ModelFacts.first_of(store.events(strategy_id, MODEL_FACTS_EVENT))
    total = facts.gpu_memory_bytes if facts else None
    return [GpuRow(index, fields[index], total) for index in sorted(fields)]
