"""One configuration trained for a few real steps as its own run (its own processes, its own run folder),
stopped early when it is clearly slower than the best so far, and the figures it is ranked by."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from offloadlab.autotune.space import Candidate
from offloadlab.results.figures import StepTimes, relative_deviation
from offloadlab.results.status import Status
from offloadlab.results.store import RunStore, StepRecord, StoreError
from offloadlab.run.runner import Launch, run_spec
from offloadlab.spec import RunSpec, SpecError


class TrialTooSlow(BaseException):
    """Raised in the trial's run when it has taken longer than the tuner gives it. A BaseException, as
    Ctrl-C is: the runner stops the job and removes what it made, whatever the run was waiting on."""


@dataclass(frozen=True)
class Trial:
    candidate: Candidate
    run_dir: Path
    status: Status
    reason: str | None
    wall_s: float
    """The whole trial: start-up, build and steps."""
    times: StepTimes | None
    """Over the steps after the start-up (start_up_steps)."""
    losses: dict[int, float]

    @property
    def tokens_per_s(self) -> float:
        return self.times.tokens_per_s if self.times else 0.0

    @property
    def measured(self) -> bool:
        return self.status is Status.DONE and self.times is not None

    def loss_deviation(self, exact: "Trial") -> float | None:
        """This trial's loss against an exact one's, at the last step both trained (the same samples)."""
        common = set(self.losses) & set(exact.losses)
        return relative_deviation(self.losses[max(common)], exact.losses[max(common)]) if common else None


def start_up_steps(candidate: Candidate) -> int:
    """Steps not counted: the first (allocator, kernels, first copies) and, for ZenFlow, those through its
    first CPU update (which starts its worker: 55 s once on a 1.42B GPT)."""
    return 1 + (candidate.prediction.placement.strategy.cpu_update_interval or 0)


def steps_to_train(candidate: Candidate, steps: int) -> int:
    """The start-up and `steps` more; for ZenFlow at least two more CPU updates, so that a periodic wait
    for them is counted."""
    return start_up_steps(candidate) + max(
        steps, 2 * (candidate.prediction.placement.strategy.cpu_update_interval or 0)
    )


@dataclass(frozen=True)
class Watch:
    """When to stop a trial: at `deadline` (time.monotonic()), or once its counted steps (or the step it is
    in, past its start-up) take over `slowest_step_s`; None: no step to hold it to yet."""

    deadline: float
    slowest_step_s: float | None


def _steps_so_far(run_dir: Path) -> tuple[sqlite3.Row, list[StepRecord]] | None:
    """The trial's one strategy and its rank-0 steps; None before its store holds them."""
    try:
        store = RunStore(run_dir)
    except (StoreError, sqlite3.Error):  # not made yet, or being made
        return None
    try:
        row = store.strategies(store.run()["id"])[0]
        return row, store.steps(row["id"])
    except (LookupError, sqlite3.Error):
        return None
    finally:
        store.close()


def _too_slow(run_dir: Path, start_up: int, total_steps: int, slowest_step_s: float) -> str | None:
    """Why the trial in run_dir is clearly slower, from what its store holds so far; None if it is not."""
    found = _steps_so_far(run_dir)
    if found is None:
        return None
    records = found[1]
    counted = [r.step_time_s for r in records[start_up:]]
    if len(counted) >= 2 and sum(counted) / len(counted) > slowest_step_s:
        return f"its steps took {sum(counted) / len(counted):.3g} s on average"
    # One step in progress is held to more: a single slow step (a collection, a page-in) is not a verdict.
    one_step_s = max(2 * slowest_step_s, slowest_step_s + 1.0)
    # After its last step the trial is ending (saving, stopping its ranks): no step is in progress.
    in_progress = start_up <= len(records) < total_steps
    if in_progress and time.time() - records[-1].t_end > one_step_s:
        return f"its step {len(records) + 1} ran past {one_step_s:.3g} s"
    return None


@contextlib.contextmanager
def _watched(run_dir: Path, start_up: int, total_steps: int, watch: Watch):
    """Checks the trial once a second from SIGALRM (the runner's wait loop sleeps in the main thread) and
    raises TrialTooSlow there."""

    def check(signum, frame):
        if time.monotonic() > watch.deadline:
            raise TrialTooSlow("stopped: the time budget ran out")
        why = _too_slow(run_dir, start_up, total_steps, watch.slowest_step_s) if watch.slowest_step_s else None
        if why:
            raise TrialTooSlow(f"stopped early, clearly slower than the best so far: {why}")

    previous = signal.signal(signal.SIGALRM, check)
    signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_trial(base: RunSpec, candidate: Candidate, steps: int, run_dir: Path, log: Console, watch: Watch) -> Trial:
    """Train the candidate for `steps` counted steps (after its start-up) in run_dir, stopped as watch says."""
    total_steps = steps_to_train(candidate, steps)
    spec = candidate.spec(base, total_steps)
    began = time.monotonic()
    try:
        with _watched(run_dir, start_up_steps(candidate), total_steps, watch):
            run_spec(spec, run_dir, Launch(), log)
    except TrialTooSlow as err:
        return _read(candidate, run_dir, time.monotonic() - began, Status.FAILED, str(err))
    except SpecError as err:  # the preflight refused it: no run folder was made
        return Trial(candidate, run_dir, Status.DOES_NOT_FIT, str(err), time.monotonic() - began, None, {})
    return _read(candidate, run_dir, time.monotonic() - began)


def _read(
    candidate: Candidate, run_dir: Path, wall_s: float, status: Status | None = None, reason: str | None = None
) -> Trial:
    found = _steps_so_far(run_dir)
    if found is None:  # stopped before its run began (the runner's own checks)
        return Trial(candidate, run_dir, status or Status.FAILED, reason, wall_s, None, {})
    row, records = found
    return Trial(
        candidate,
        run_dir,
        status or Status(row["status"]),
        reason or row["reason"],
        wall_s,
        StepTimes.of_steps(records[start_up_steps(candidate) :]),
        {r.step: r.loss for r in records},
    )
