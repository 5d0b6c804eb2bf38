"""Side-by-side figures of a run's strategies, computed from the run store (for `compare`, `report`, the TUI)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import statistics
import time
import tomllib
from dataclasses import asdict, dataclass

from offloadlab.results import figures
from offloadlab.results.rundir import DB_NAME
from offloadlab.results.status import DIED_REASON, Status
from offloadlab.results.steps import PHASES, FollowedStrategy
from offloadlab.results.store import RunStore, StoreError
from offloadlab.spec import strategy_from_store

PLAN_EVENT = "plan"
"""The event a run records for a strategy it was given a plan for (`offloadlab run --plan`)."""


@dataclass(frozen=True)
class Planned:
    """What `offloadlab plan` predicted for a strategy, and the links it measured, held beside the run."""

    step_s: float | None
    """The plan's predicted step; None where it had none (a placement that did not fit)."""
    bound_by: str | None
    gpu_bytes: float
    host_bytes: float
    pcie_link_gbps: tuple[float, float] | None
    """(to GPU, to host) GB/s of pinned copies, as the plan measured them."""

    @classmethod
    def from_json(cls, detail: str) -> "Planned":
        raw = json.loads(detail)
        link = raw.get("pcie_link_gbps")
        return cls(raw["step_s"], raw["bound_by"], raw["gpu_bytes"], raw["host_bytes"], tuple(link) if link else None)


def record_plan(store: RunStore, strategy_id: int, planned: Planned) -> None:
    store.add_events(strategy_id, 0, [(None, PLAN_EVENT, time.time(), None, json.dumps(asdict(planned)))])


@dataclass(frozen=True)
class StrategySummary:
    name: str
    engine: str
    status: Status
    reason: str | None
    steps_done: int
    steps_planned: int
    median_step_time_s: float | None
    p90_step_time_s: float | None
    mean_step_time_s: float | None
    max_step_time_s: float | None
    stalls: int | None
    """Steady steps over figures.STALL_FACTOR times the median."""
    tokens_per_s: float | None
    """Throughput: tokens over seconds of all steady steps (not a median step's)."""
    practicality: float | None
    """tokens_per_s over the fastest strategy's of the run that offloads nothing (same model, same machine)."""
    exact: bool | None
    """Whether the strategy applies exact AdamW each step (ZenFlow does not); None if unknown."""
    last_loss_deviation: float | None
    """Relative difference of the last loss from an exact strategy's last loss at the same step."""
    mfu_percent: float | None
    """Model FLOPs utilization per GPU against figures.PEAK_TFLOPS; None on a device not in that table."""
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    host_rss_peak_bytes: int | None
    pinned_swap_bytes: int | None
    """Page-locked RAM of NVMe swap buffers (`offloadlab tune --spec` sizes them); None if no engine was built."""
    gpu_memory_bytes: int | None
    """What the GPU peaks are held against: the run's GPU memory budget where it had one, else the GPU's memory;
    None on the CPU or before the engine was built."""
    gpu_budget_bytes: int | None
    """The GPU memory budget the run was held to (`gpu_memory_limit_gib`); None: the whole GPU."""
    host_memory_bytes: int | None
    """The host's RAM, what the RSS peak is held against."""
    disk_read_bytes_per_step: float | None
    """Block-layer bytes the strategy's own processes read per step, all ranks (/proc/PID/io)."""
    disk_write_bytes_per_step: float | None
    device_read_bytes_per_step: float | None
    """Bytes the nvme_path's device moved per step, whoever asked (the sampler's diskstats)."""
    device_write_bytes_per_step: float | None
    gpu_idle_share: float | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None
    comm_bytes_per_step: float | None
    """Collective bytes rank 0 sent or received per step (all-gather, reduce-scatter, all-reduce, broadcast)."""
    comm_seconds_per_step: float | None
    """Time rank 0 blocked in those calls per step."""
    checkpoint_verified: bool | None
    checkpoint_detail: str | None
    first_loss: float | None
    last_loss: float | None
    practicality_baseline: str | None = None
    """Whose tokens/s practicality is over: a strategy of this run, or "RUN/STRATEGY" of a run stored beside
    it (same model, batch, precision and GPU) when this one has no strategy without offload."""
    tuned_drive_gbps: tuple[float, float] | None = None
    """(read, write) GB/s the tune measured on the drive, for a strategy run with its `tuned` fragment."""
    planned: Planned | None = None
    phase_seconds: dict[str, float] | None = None
    """Mean seconds of a steady step in each of steps.PHASES and "other" (the rest of the step: data,
    hooks, waits outside the timed phases), rank 0; None without phase events."""
    cpu_threads: int | None = None
    """Threads rank 0's CPU optimizer ran on (its pinned physical cores)."""
    cpu_cores: tuple[int, ...] = ()
    params_per_rank: int | None = None
    """Parameters each rank's optimizer steps (the model's over the ranks: every engine here shards it)."""
    nvme_wait_seconds: dict[str, float] | None = None
    """Of `phase_seconds`, the mean seconds rank 0 waited for its NVMe swaps to complete in each (the
    drive's time that compute did not hide); None where nothing swaps."""
    tensors_on_nvme: tuple[int, int] | None = None
    """(parameters, optimizer sub-groups) rank 0's engine kept on NVMe; None: no NVMe offload (or unknown)."""

    @property
    def swapped_nothing(self) -> bool:
        return figures.swapped_nothing(self.tensors_on_nvme)

    @property
    def nvme_gbps(self) -> tuple[float, float] | None:
        """(read, write) GB/s the strategy's processes moved over a median step, NVMe strategies only."""
        if not self.median_step_time_s or not (self.disk_read_bytes_per_step or self.disk_write_bytes_per_step):
            return None
        step = self.median_step_time_s * 1e9
        return (self.disk_read_bytes_per_step or 0.0) / step, (self.disk_write_bytes_per_step or 0.0) / step

    @property
    def pcie_gbps(self) -> tuple[float, float] | None:
        """(to GPU, to host) GB/s over the steady steps (NVML's rx and tx)."""
        if self.pcie_rx_bytes_per_s is None or self.pcie_tx_bytes_per_s is None:
            return None
        return self.pcie_rx_bytes_per_s / 1e9, self.pcie_tx_bytes_per_s / 1e9

    @property
    def step_against_plan(self) -> float | None:
        """The mean steady step over the plan's prediction (1.0: the step the plan said)."""
        if self.planned is None or not self.planned.step_s or not self.mean_step_time_s:
            return None
        return self.mean_step_time_s / self.planned.step_s

    @property
    def optimizer_params_per_s(self) -> float | None:
        """Parameters rank 0's optimizer stepped a second over the steady steps' optimizer phase."""
        if not self.phase_seconds or not self.phase_seconds.get("optimizer") or not self.params_per_rank:
            return None
        return self.params_per_rank / self.phase_seconds["optimizer"]

    @property
    def nvme_wait_share(self) -> float | None:
        """The wait for NVMe swaps, all phases together, as a share of the mean steady step."""
        if self.nvme_wait_seconds is None or not self.mean_step_time_s:
            return None
        return sum(self.nvme_wait_seconds.values()) / self.mean_step_time_s

    def nvme_waiting_in(self, phase: str) -> float:
        """Of a steady step's `phase_seconds[phase]`, the part spent waiting for NVMe swaps."""
        return min((self.nvme_wait_seconds or {}).get(phase, 0.0), (self.phase_seconds or {}).get(phase, 0.0))

    @property
    def bound_by(self) -> tuple[str, float] | None:
        """The phase that takes the largest share of the step, and that share."""
        if not self.phase_seconds:
            return None
        total = sum(self.phase_seconds.values())
        name = max(self.phase_seconds, key=self.phase_seconds.get)
        return (name, self.phase_seconds[name] / total) if total > 0 else None

    def stored(self) -> str:
        """Its fields as JSON, as store_figures keeps them (floats round-trip exactly)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_stored(cls, text: str) -> "StrategySummary":
        raw = json.loads(text)
        planned = raw["planned"]
        if planned is not None:
            link = planned["pcie_link_gbps"]
            raw["planned"] = Planned(**{**planned, "pcie_link_gbps": tuple(link) if link else None})
        for name in ("tuned_drive_gbps", "cpu_cores", "tensors_on_nvme"):  # JSON has lists only
            raw[name] = None if raw[name] is None else tuple(raw[name])
        return cls(**{**raw, "status": Status(raw["status"])})

    def as_dict(self) -> dict:
        bound = self.bound_by
        return {
            **asdict(self),
            "bound_by": None if bound is None else {"phase": bound[0], "share": bound[1]},
            "nvme_gbps": self.nvme_gbps,
            "step_against_plan": self.step_against_plan,
            "nvme_wait_share": self.nvme_wait_share,
            "optimizer_params_per_s": self.optimizer_params_per_s,
        }


def _max_or_none(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _median_field(values: list[float | None]) -> float | None:
    return figures.median([v for v in values if v is not None])


class SummaryCache:
    """One store's strategies as followed between reads (steps.FollowedStrategy): the TUI keeps one per
    run it shows, so each poll reads and aggregates only what the run wrote since the last."""

    def __init__(self, recompute_share: float | None = None):
        self.strategies: dict[int, FollowedStrategy] = {}
        self.summaries: dict[int, tuple[tuple, StrategySummary]] = {}
        """A strategy's figures before they are set against the others', with what they were read from."""
        self.recompute_share = recompute_share
        """Where set (the TUI's polls), a running strategy's figures over all its steps are recomputed only
        once the time since their last computation is 1/share times what it took, so they cost at most this
        share of a core; between, only its step count follows. A poll of a 6-hour run spent 19 ms of its 26
        re-deriving medians and phase means that one more step barely moves, and the cost grows with the
        steps. None (compare, report): every read is exact."""
        self._computed: dict[int, tuple[float, float]] = {}
        """(when it started, seconds it took) of each strategy's last computation, on perf_counter's clock."""
        self.stored_baseline: tuple[tuple[float, str] | None] | None = None
        """Looked up once: (the stored no-offload baseline or None,), None before the lookup."""

    def summary(
        self, row, status: Status, reason: str | None, followed: FollowedStrategy, strategy
    ) -> StrategySummary:
        """The strategy's figures: kept where nothing new was read, or recomputed (see recompute_share)."""
        key = (tuple(row), status, reason, followed.version)
        kept = self.summaries.get(row["id"])
        if kept and kept[0] == key:
            return kept[1]
        running = status is Status.RUNNING and kept is not None and kept[1].status is Status.RUNNING
        if running and self._recent(row["id"]):
            summary = dataclasses.replace(kept[1], steps_done=len(followed.rank0))
        else:
            started = time.perf_counter()
            summary = _summary(row, status, reason, followed, strategy)
            self._computed[row["id"]] = (started, time.perf_counter() - started)
        self.summaries[row["id"]] = (key, summary)
        return summary

    def _recent(self, strategy_id: int) -> bool:
        if self.recompute_share is None or strategy_id not in self._computed:
            return False
        at, took = self._computed[strategy_id]
        return time.perf_counter() - at < took / self.recompute_share

    def follow(self, store: RunStore, strategy_id: int, finished: bool) -> FollowedStrategy:
        followed = self.strategies.setdefault(strategy_id, FollowedStrategy(strategy_id))
        followed.update(store, finished)
        return followed


def rank0_steps(store: RunStore, cache: SummaryCache, strategy_id: int) -> list:
    """A strategy's rank-0 steps: as the cache followed them, or read (a strategy summarized from its stored
    figures was not followed)."""
    followed = cache.strategies.get(strategy_id)
    return followed.rank0 if followed is not None else store.steps(strategy_id, rank=0)


def _mean_by_phase(steps: list[dict[str, float]]) -> dict[str, float] | None:
    return {name: statistics.fmean(spent[name] for spent in steps) for name in steps[0]} if steps else None


def _phase_seconds(followed: FollowedStrategy, steady: list) -> dict[str, float] | None:
    """Rank 0's mean seconds in each of PHASES and outside them, over the steady steps that were timed:
    summed in one pass (a day of steps is 4k of them, read each time compare runs)."""
    totals, other, timed = dict.fromkeys(PHASES, 0.0), 0.0, 0
    for r in steady:
        spent = followed.phases.get(r.step)
        if spent is None:
            continue
        timed += 1
        for name, seconds in spent.items():
            totals[name] += seconds
        other += r.step_time_s - sum(spent.values())
    if not timed:
        return None
    return {**{name: total / timed for name, total in totals.items()}, "other": max(0.0, other / timed)}


def _model_facts(followed: FollowedStrategy) -> figures.ModelFacts | None:
    return figures.ModelFacts.first_of(followed.events.get(figures.MODEL_FACTS_EVENT))


def summarize(store: RunStore, cache: SummaryCache | None = None) -> list[StrategySummary]:
    """Every strategy's figures; with a cache kept from the last call, only what is new is read."""
    cache = cache or SummaryCache()
    run = store.run()
    if not store.strategies(run["id"]) and store.tune_points(run["id"]):
        raise StoreError(
            f"{store.run_dir} holds a tune, not a run: its result is tuned.toml there, and "
            f"'offloadlab tui {store.run_dir}' shows its sweep"
        )
    died = store.run_status() is Status.INTERRUPTED
    out, offloads = [], {}
    for row in store.strategies(run["id"]):
        status, reason = status_of(row, died)
        strategy = strategy_from_store(json.loads(row["config_json"]))
        summary = _stored_summary(store, row, cache) if status.finished else None
        if summary is None:
            # A strategy that wrote nothing since the last read (a finished one, all through a long run's
            # polls) keeps its figures: only new steps, samples or events change them.
            followed = cache.follow(store, row["id"], finished=status.finished)
            summary = cache.summary(row, status, reason, followed, strategy)
        out.append(summary)
        offloads[row["name"]] = strategy.offloads if strategy else None
    if not any(offloads[s.name] is False and s.status is Status.DONE and s.tokens_per_s for s in out):
        if cache.stored_baseline is None:
            facts = _first_model_facts(store, run["id"])
            cache.stored_baseline = (stored_baseline(store, facts),) if facts else None
    return _against_each_other(out, offloads, cache.stored_baseline[0] if cache.stored_baseline else None)


def status_of(row: sqlite3.Row, run_died: bool) -> tuple[Status, str | None]:
    """A strategy's status and reason as readers show them: one left running or pending by a run whose
    process went (run_status() INTERRUPTED) reads failed, not running or waiting."""
    status = Status(row["status"])
    if run_died and status.unfinished:
        return Status.FAILED, f"{Status.INTERRUPTED}: {DIED_REASON}"
    return status, row["reason"]


def store_figures(store: RunStore, strategy_id: int) -> None:
    """A strategy's own figures, kept in the store once it has ended and nothing more is written for it
    (the runner calls this last): readers then take them from one row, not from its steps, events and
    samples (a day of steps on 8 ranks is 35k step rows, and the events as many again)."""
    row = store.strategy(strategy_id)
    followed = FollowedStrategy(strategy_id)
    followed.update(store, finished=True)
    strategy = strategy_from_store(json.loads(row["config_json"]))
    summary = _summary(row, Status(row["status"]), row["reason"], followed, strategy)
    store.put_strategy_figures(strategy_id, _written_for(row), summary.stored())


def _written_for(row: sqlite3.Row) -> str:
    return json.dumps(tuple(row))


def _stored_summary(store: RunStore, row: sqlite3.Row, cache: SummaryCache) -> StrategySummary | None:
    """The figures store_figures kept for this row as it is now; None where there are none (a store written
    before them, a run killed before the strategy's end) or the row has changed since."""
    key = ("stored", tuple(row))
    kept = cache.summaries.get(row["id"])
    if kept and kept[0] == key:
        return kept[1]
    summary = _as_stored(store, row)
    if summary is not None:
        cache.summaries[row["id"]] = (key, summary)
    return summary


def _as_stored(store: RunStore, row: sqlite3.Row) -> StrategySummary | None:
    stored = store.strategy_figures(row["id"])
    if stored is None or stored[0] != _written_for(row):
        return None
    return StrategySummary.from_stored(stored[1])


def _first_model_facts(store: RunStore, run_id: int) -> figures.ModelFacts | None:
    facts = (
        figures.ModelFacts.first_of(store.events_of_rank(r["id"], figures.MODEL_FACTS_EVENT, 0, limit=1))
        for r in store.strategies(run_id)
    )
    return next((f for f in facts if f is not None), None)


def _batch(spec_toml: str) -> int | None:
    """Samples per optimizer step over all ranks: another split of the same batch (a micro-batch of 32 x 2
    for one of 64 x 1, as autotune picks per configuration) trains the same tokens a step."""
    raw = tomllib.loads(spec_toml)
    micro_batch = raw.get("micro_batch")
    return None if micro_batch is None else micro_batch * raw.get("grad_accum", 1) * raw.get("nproc", 1)


def stored_baseline(store: RunStore, facts: figures.ModelFacts) -> tuple[float, str] | None:
    """The fastest finished strategy without offload in another run stored beside this one (the same parent
    folder, as `offloadlab run` puts them under runs/) of the same model, batch, precision and GPU:
    (its tokens/s, "RUN/STRATEGY"). Only for a run that has no such strategy of its own."""
    best = None
    batch = _batch(store.run()["spec_toml"])
    for other in sorted(store.run_dir.parent.glob(f"*/{DB_NAME}")):
        if other.parent.resolve() == store.run_dir.resolve():
            continue
        try:
            found = _fastest_without_offload(RunStore(other.parent), facts, batch)
        except (StoreError, sqlite3.DatabaseError, LookupError, tomllib.TOMLDecodeError):
            continue  # not a run store, or one being written: not a baseline
        if found and (best is None or found[0] > best[0]):
            best = found
    return best


def _fastest_without_offload(
    store: RunStore, facts: figures.ModelFacts, batch: int | None
) -> tuple[float, str] | None:
    try:
        run = store.run()
        if _batch(run["spec_toml"]) != batch:
            return None
        best = None
        for row in store.strategies(run["id"]):
            strategy = strategy_from_store(json.loads(row["config_json"]))
            if Status(row["status"]) is not Status.DONE or strategy is None or strategy.offloads:
                continue
            theirs = figures.ModelFacts.first_of(
                store.events_of_rank(row["id"], figures.MODEL_FACTS_EVENT, 0, limit=1)
            )
            if theirs is None or not _same_workload(theirs, facts):
                continue
            stored = _as_stored(store, row)  # one row, not a day of steps on every rank
            if stored is not None:
                tokens_per_s = stored.tokens_per_s
            else:  # a store written before stored figures: from its steps
                times = figures.StepTimes.of_steps(figures.steady_state(store.steps(row["id"])))
                tokens_per_s = times.tokens_per_s if times else None
            if tokens_per_s and (best is None or tokens_per_s > best[0]):
                best = (tokens_per_s, f"{store.run_dir.name}/{row['name']}")
        return best
    finally:
        store.close()


def _same_workload(a: figures.ModelFacts, b: figures.ModelFacts) -> bool:
    keys = ("n_params", "n_layers", "d_model", "seq_len", "precision", "device_name", "world_size")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _summary(row, status: Status, reason: str | None, followed: FollowedStrategy, strategy) -> StrategySummary:
    """One strategy's figures from what the cache followed, before practicality and the loss check."""
    rank0 = followed.rank0
    steady = figures.steady_state(rank0)
    times = figures.StepTimes.of_steps(steady)
    all_ranks = list(followed.all_ranks.values())
    steady_all_ranks = [followed.all_ranks[r.step] for r in steady if r.step in followed.all_ranks]
    telemetry = followed.step_telemetry(steady)
    comm = [followed.comm[r.step] for r in steady if r.step in followed.comm]
    verified = row["checkpoint_verified"]
    tokens_per_s = times.tokens_per_s if times else None
    facts = _model_facts(followed)
    return StrategySummary(
        name=row["name"],
        engine=row["engine"],
        status=status,
        reason=reason,
        steps_done=len(rank0),
        steps_planned=row["steps_planned"],
        median_step_time_s=times.p50_s if times else None,
        p90_step_time_s=times.p90_s if times else None,
        mean_step_time_s=times.mean_s if times else None,
        max_step_time_s=times.max_s if times else None,
        stalls=times.stalls if times else None,
        tokens_per_s=tokens_per_s,
        practicality=None,
        exact=strategy.exact if strategy else None,
        last_loss_deviation=None,
        mfu_percent=figures.mfu_percent(tokens_per_s, facts) if facts and tokens_per_s else None,
        peak_allocated_bytes=_max_or_none([r.peak_allocated_bytes for r in all_ranks]),
        peak_reserved_bytes=_max_or_none([r.peak_reserved_bytes for r in all_ranks]),
        host_rss_peak_bytes=_max_or_none([r.host_rss_peak_bytes for r in all_ranks]),
        pinned_swap_bytes=facts.pinned_swap_bytes if facts else None,
        gpu_memory_bytes=facts.gpu_capacity_bytes if facts else None,
        gpu_budget_bytes=facts.gpu_budget_bytes if facts else None,
        host_memory_bytes=facts.host_memory_bytes if facts else None,
        disk_read_bytes_per_step=figures.median([r.disk_read_bytes for r in steady_all_ranks]),
        disk_write_bytes_per_step=figures.median([r.disk_write_bytes for r in steady_all_ranks]),
        device_read_bytes_per_step=_median_field([t.device_read_bytes for t in telemetry]),
        device_write_bytes_per_step=_median_field([t.device_write_bytes for t in telemetry]),
        gpu_idle_share=_median_field([t.gpu_idle_share for t in telemetry]),
        pcie_tx_bytes_per_s=_median_field([t.pcie_tx_bytes_per_s for t in telemetry]),
        pcie_rx_bytes_per_s=_median_field([t.pcie_rx_bytes_per_s for t in telemetry]),
        comm_bytes_per_step=figures.median([c[0] for c in comm]),
        comm_seconds_per_step=figures.median([c[1] for c in comm]),
        checkpoint_verified=None if verified is None else bool(verified),
        checkpoint_detail=row["checkpoint_detail"],
        first_loss=rank0[0].loss if rank0 else None,
        last_loss=rank0[-1].loss if rank0 else None,
        phase_seconds=_phase_seconds(followed, steady),
        cpu_threads=facts.cpu_threads if facts else None,
        cpu_cores=tuple(facts.cpu_cores) if facts else (),
        params_per_rank=facts.n_params // facts.world_size if facts else None,
        tensors_on_nvme=tuple(facts.tensors_on_nvme) if facts and facts.tensors_on_nvme is not None else None,
        nvme_wait_seconds=_mean_by_phase([followed.swap_wait[r.step] for r in steady if r.step in followed.swap_wait]),
        tuned_drive_gbps=getattr(strategy, "tuned_drive_gbps", None),
        planned=Planned.from_json(followed.events[PLAN_EVENT][-1]["detail"])
        if PLAN_EVENT in followed.events
        else None,
    )


def _against_each_other(
    summaries: list[StrategySummary], offloads: dict[str, bool | None], stored: tuple[float, str] | None
) -> list[StrategySummary]:
    """Practicality against the fastest finished strategy that offloads nothing (of this run, else the
    stored one), and the last loss against an exact strategy's that ran as many steps."""
    without_offload = [
        (s.tokens_per_s, s.name) for s in summaries if offloads[s.name] is False and s.status is Status.DONE
    ]
    baseline, baseline_name = max((t for t in without_offload if t[0]), default=stored or (None, None))
    exact = [s for s in summaries if s.exact and s.status is Status.DONE and s.last_loss is not None]
    out = []
    for s in summaries:
        reference = next((e.last_loss for e in exact if e.steps_done == s.steps_done), None)
        out.append(
            dataclasses.replace(
                s,
                practicality=figures.practicality(s.tokens_per_s, baseline),
                practicality_baseline=baseline_name if s.tokens_per_s and baseline else None,
                last_loss_deviation=figures.relative_deviation(s.last_loss, reference),
            )
        )
    return out
