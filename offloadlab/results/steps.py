"""Per-step figures derived from the sampler's series and the steps' start/end times (same clock)."""

from __future__ import annotations

import bisect
import json
import math
import statistics
from typing import NamedTuple

from offloadlab.results.figures import MODEL_FACTS_EVENT, ModelFacts
from offloadlab.results.store import RunStore, StepRecord, StepTelemetry


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


# What the engines time inside a step (engines.base.PhaseTimer), in the order they run.
PHASES = ("forward", "backward", "optimizer")
# A step's NVMe swaps on one rank (train.swap_meter): bytes read and written, and the time waited on them.
TELEMETRY_NOTE = "telemetry_note"
"""What the sampler could not measure (no NVML, no block device for the path), said once per strategy."""
SWAP_EVENT = "swap"
SWAP_WAITS = (*PHASES, "other")
"""Where a step's NVMe waits fell: inside each of PHASES, or outside them."""
COMM_EVENT_PREFIX = "comm."
# The sampler's series the per-step figures are computed from.
SERIES = {
    "util": "gpu%.util(%)",
    "tx": "gpu%.pcie_tx(B/s)",
    "rx": "gpu%.pcie_rx(B/s)",
    "read": "disk.read_bytes(B)",
    "written": "disk.write_bytes(B)",
}


class AllRanks(NamedTuple):
    """One step's figures over every rank: bytes add up, peaks are the highest rank's. A tuple: a day's
    read builds one per step (a frozen dataclass's init took 3 of a 24-hour store's 60 ms)."""

    disk_read_bytes: float
    disk_write_bytes: float
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    host_rss_peak_bytes: int | None


class FollowedStrategy:
    """A strategy's steps and per-step figures as read so far. Each `update` reads only what was written
    since the last one. A step's figures are read as the sampler stored them once its samples were all in;
    only steps without them (the newest of a live run, every step of a store written before they were
    stored) are measured here from their samples: on an hours-long store a read costs the steps, not the
    samples."""

    def __init__(self, strategy_id: int):
        self.strategy_id = strategy_id
        self.rank0: list[StepRecord] = []
        self.all_ranks: dict[int, AllRanks] = {}
        self.telemetry: dict[int, StepTelemetry] = {}
        """Final figures of the steps whose samples are all in."""
        self.comm: dict[int, tuple[float, float]] = {}
        """step -> (bytes, seconds) of rank 0's collectives in training, all kinds together."""
        self.swap_wait: dict[int, dict[str, float]] = {}
        """step -> seconds rank 0 waited for its NVMe swaps in training inside each of PHASES and outside
        them ("other"); strategies that swap only."""
        self.phases: dict[int, dict[str, float]] = {}
        """step -> seconds rank 0 spent in each of PHASES (a phase can repeat: one per micro-batch)."""
        self.events: dict[str, list] = {}
        """Rank 0's and the sampler's events of no step by kind (the model's facts, the plan, the ranks'
        processes, the sampler's notes), in the order recorded."""
        self._rows: dict[str, list[tuple]] = {key: [] for key in SERIES}
        self._last_sample_t: dict[str, float] = {key: -math.inf for key in SERIES}
        self._last_event_id = 0
        """Every strategy's events up to this one have been read."""
        self._events_read = 0
        self._stored_through = 0
        """The last step whose stored figures were read."""
        self._totals_through = 0
        """The last step whose step_totals row was read (or, in the sampler, written)."""
        self._ranks_written: dict[int, int] = {}
        """step -> how many ranks had written it, for the steps summed from their rows."""
        self._complete_through = 0
        """Every step up to this one has been written by every rank (where the world size is known)."""
        self._open: dict[int, StepTelemetry] = {}
        """Figures of steps whose samples may still be on their way: recomputed on the next update."""
        self.version: tuple = ()
        """Changes whenever an update read anything new."""

    def update(self, store: RunStore, finished: bool) -> None:
        self._read_totals(store)
        last = self.rank0[-1].step if self.rank0 else 0
        self.rank0 += store.steps(self.strategy_id, rank=0, after_step=last)
        self._read_events(store)  # after the steps: rank 0 writes a step's events before its next step
        # Other ranks' rows of the newest steps may still be on their way: the steps not yet written by
        # every rank are summed again.
        world = self._world_size()
        resum_from = min(last - 1, self._complete_through) if world else last - 1
        for step, ranks, *figures in store.steps_over_ranks(
            self.strategy_id, after_step=max(0, self._totals_through, resum_from)
        ):
            self.all_ranks[step] = AllRanks(*figures)
            self._ranks_written[step] = ranks
        while world and self._ranks_written.get(self._complete_through + 1, 0) >= world:
            self._complete_through += 1
        stored = store.step_telemetry(self.strategy_id, after_step=self._stored_through)
        self.telemetry.update(stored)
        self._stored_through = max(stored, default=self._stored_through)
        pending = [s for s in self.rank0 if s.step not in self.telemetry]
        if pending:
            self._read_samples(store, pending[0].t_start)
        self._measure_steps(pending, finished)
        self.version = (len(self.rank0), self._events_read, *self._last_sample_t.values(), len(self.telemetry))

    def _read_samples(self, store: RunStore, first_pending_start: float) -> None:
        """The samples since the last read, or, when the steps read so far had stored figures, from the
        last sample before the first step without them (a counter is interpolated from it)."""
        for key, pattern in SERIES.items():
            if self._last_sample_t[key] < first_pending_start:
                since = store.last_sample_t_before(self.strategy_id, pattern, first_pending_start)
                if self._last_sample_t[key] < since:
                    self._rows[key], self._last_sample_t[key] = [], math.nextafter(since, -math.inf)
            new = store.samples(self.strategy_id, pattern, after_t=self._last_sample_t[key])
            self._rows[key] += new
            if new:
                self._last_sample_t[key] = new[-1][0]

    def _read_totals(self, store: RunStore) -> None:
        """The steps the sampler stored totals of: their ranks' rows and rank 0's timings are not read."""
        rows = store.step_totals(self.strategy_id, after_step=self._totals_through)
        for row in rows:  # indexed, not unpacked: a day's read has 4k of them
            step = row[0]
            self.all_ranks[step] = AllRanks(*row[1:6])
            phases = {name: s for name, s in zip(PHASES, row[6:9]) if s is not None}
            if phases:
                self.phases[step] = phases
            if row[9] is not None:
                self.comm[step] = (row[9], row[10])
            if row[11] is not None:
                self.swap_wait[step] = dict(zip(SWAP_WAITS, row[11:15]))
        if rows:
            self._totals_through = self._complete_through = rows[-1][0]

    def _world_size(self) -> int | None:
        facts = ModelFacts.first_of(self.events.get(MODEL_FACTS_EVENT))
        return facts.world_size if facts else None

    def final_totals(self, finished: bool) -> list[tuple]:
        """step_totals rows of the steps past those stored that every rank has written and whose rank-0
        events are in: rank 0 has written a later step (it writes a step's events before the next one),
        or the sampler has ended (after rank 0's last step). Not the last step's where another rank's row
        is not in yet as the sampler ends (its readers sum that step's rows), nor any without the world
        size (a strategy that did not record its model's facts)."""
        if self._world_size() is None:
            return []
        newest = self.rank0[-1].step if self.rank0 else 0
        last_final = min(newest if finished else newest - 1, self._complete_through)
        first = bisect.bisect_right([r.step for r in self.rank0], self._totals_through)
        rows = [self._totals_row(r.step) for r in self.rank0[first:] if r.step <= last_final]
        if rows:
            self._totals_through = rows[-1][0]
        return rows

    def _totals_row(self, step: int) -> tuple:
        phases, comm, waits = self.phases.get(step, {}), self.comm.get(step), self.swap_wait.get(step)
        return (
            step,
            *self.all_ranks[step],
            *(phases.get(name) for name in PHASES),
            *(comm or (None, None)),
            *((waits[name] for name in SWAP_WAITS) if waits else (None,) * len(SWAP_WAITS)),
        )

    def _read_events(self, store: RunStore) -> None:
        """Rank 0's: the other ranks' per-step events are as many again per rank, and nothing reads them.
        Phases come summed per step from SQL (a day of steps has 50k of them)."""
        up_to = store.last_event_id()
        after, self._last_event_id = self._last_event_id, up_to
        if after == 0 and self._totals_through:
            after = self._read_stepless_events(store, up_to)
        for step, kind, seconds in store.seconds_by_step(self.strategy_id, 0, PHASES, after, up_to):
            self._events_read += 1
            if step <= self._totals_through:
                continue  # in its stored totals (this read found it there), or written after them: a re-run
            spent = self.phases.setdefault(step, {})
            spent[kind] = spent.get(kind, 0.0) + seconds
        for e in store.events(self.strategy_id, after_id=after, rank=0, up_to_id=up_to, except_kinds=PHASES):
            self._events_read += 1
            if not e["kind"].startswith(COMM_EVENT_PREFIX) and e["kind"] != SWAP_EVENT:
                if e["step"] is None:  # a step's other events (a checkpoint's save): nothing reads them
                    self.events.setdefault(e["kind"], []).append(e)
                continue
            if e["step"] <= self._totals_through:
                continue  # as the phases above
            totals = json.loads(e["detail"])
            if e["rank"] != 0 or totals["phase"] != "train":
                continue  # the step re-run after a restore carries the same number
            if e["kind"] == SWAP_EVENT:
                by_phase = {name: totals["wait_by_phase"].get(name, 0.0) for name in PHASES}
                outside = max(0.0, totals["wait_seconds"] - sum(by_phase.values()))
                self.swap_wait[e["step"]] = {**by_phase, "other": outside}
                continue
            nbytes, seconds = self.comm.get(e["step"], (0.0, 0.0))
            self.comm[e["step"]] = (nbytes + totals["bytes"], seconds + totals["seconds"])

    def _read_stepless_events(self, store: RunStore, up_to: int) -> int:
        """The first read where stored totals cover the first steps: of the events before the first of a
        step past them, those of no step (the totals hold the steps'; a seek in events_by_step, not a walk
        over a day of them). Returns the last id so read."""
        first_untotalled = store.first_event_id_after_step(self.strategy_id, 0, self._totals_through)
        through = up_to if first_untotalled is None else first_untotalled - 1
        for e in store.events(self.strategy_id, rank=0, up_to_id=through, stepless=True):
            self._events_read += 1
            self.events.setdefault(e["kind"], []).append(e)
        return through

    def _measure_steps(self, pending: list[StepRecord], finished: bool) -> None:
        self._open = {}
        if not pending:
            return
        util, tx, rx = (SampledSeries(self._rows[k]) for k in ("util", "tx", "rx"))
        read, written = CumulativeSeries(self._rows["read"]), CumulativeSeries(self._rows["written"])
        newest = max(self._last_sample_t.values())
        still_open = []
        for s in pending:
            mean_util = util.mean_in(s.t_start, s.t_end)
            figures = StepTelemetry(
                gpu_idle_share=None if mean_util is None else 1.0 - mean_util / 100.0,
                device_read_bytes=read.between(s.t_start, s.t_end),
                device_write_bytes=written.between(s.t_start, s.t_end),
                pcie_tx_bytes_per_s=tx.mean_in(s.t_start, s.t_end),
                pcie_rx_bytes_per_s=rx.mean_in(s.t_start, s.t_end),
            )
            # No sample at all: the sampler is off (it starts before the engine is built), so none will come.
            if finished or newest > s.t_end or newest == -math.inf:
                self.telemetry[s.step] = figures
            else:
                self._open[s.step] = figures
                still_open.append(s)
        # The next step starts where the last one known ended: its samples are kept from there.
        self._forget_rows_before(still_open[0].t_start if still_open else self.rank0[-1].t_end)

    def _forget_rows_before(self, t: float) -> None:
        """Keep the last sample before t (a counter is interpolated from it) and everything after."""
        for key, rows in self._rows.items():
            i = bisect.bisect_left([r[0] for r in rows], t)
            self._rows[key] = rows[max(0, i - 1) :]

    def step_telemetry(self, steps: list[StepRecord]) -> list[StepTelemetry]:
        known = {**self.telemetry, **self._open}
        return [known[s.step] for s in steps if s.step in known]


class StepFigures:
    """What the sampler stores of its strategy's steps: each step's figures once its samples are all in
    (samples past its end, or the strategy over), so readers need not read the samples again."""

    def __init__(self, strategy_id: int):
        self.followed = FollowedStrategy(strategy_id)
        self.stored_through = 0

    def store_final(self, store: RunStore, strategy_finished: bool) -> None:
        self.followed.update(store, strategy_finished)
        final = {step: f for step, f in self.followed.telemetry.items() if step > self.stored_through}
        if final:
            store.add_step_telemetry(self.followed.strategy_id, final)
            self.stored_through = max(final)
        totals = self.followed.final_totals(strategy_finished)
        if totals:
            store.add_step_totals(self.followed.strategy_id, totals)
