"""The search: every configuration in the planner's order for a few steps (a screen), each stopped once it
has taken clearly longer than the fastest finished one, then the leaders again for longer (the second
round), all within the time budget."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from offloadlab.autotune.space import Candidate
from offloadlab.autotune.trials import Trial, Watch, run_trial
from offloadlab.spec import RunSpec, SpecError

SLOWER_THAN_FASTEST = 2.0
"""A trial whose counted steps (or the step it is in) take this many times the fastest trial's mean step
is stopped: the tokens per step are the same in every trial, so its throughput is at most half."""
CONFIRMED_AT_MOST = 4
"""Second-round trials at most: the leaders, and those that lead when a leader falls back."""
CONFIRM_FACTOR = 3
"""The second round trains this many times the screen's steps."""


def parse_budget(text: str) -> float:
    """Seconds of "20m", "90s", "1h30m" or "45" (minutes)."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text) * 60
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if not text or not match:
        raise SpecError(f"--budget {text!r}: give a time such as 20m, 90s or 1h30m")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def duration_text(seconds: float) -> str:
    """90 -> "1 min 30 s", 3600 -> "1 h", as a budget was given (parse_budget's forms)."""
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((hours, "h"), (minutes, "min"), (secs, "s")) if n]
    return " ".join(parts) or "0 s"


@dataclass
class Budget:
    seconds: float
    began: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.began)


@dataclass
class Search:
    screened: list[Trial] = field(default_factory=list)
    confirmed: list[Trial] = field(default_factory=list)
    not_tried: list[Candidate] = field(default_factory=list)
    """Candidates the budget ran out before."""

    def ranked(self) -> list[Trial]:
        """Each configuration's latest measured trial, fastest first."""
        latest = {t.candidate.name: t for t in self.screened + self.confirmed if t.measured}
        return sorted(latest.values(), key=lambda t: t.tokens_per_s, reverse=True)

    def best(self, exact_only: bool) -> Trial | None:
        return next((t for t in self.ranked() if t.candidate.exact or not exact_only), None)


def watch(done: list[Trial], budget: Budget, exact: bool) -> Watch:
    """Until the budget's end, and no step over SLOWER_THAN_FASTEST times the fastest trial's mean step; an
    exact configuration is held to the fastest exact one only (the fastest exact is a result of its own: on
    an H200, ZenFlow's 0.17 s step stopped every exact trial when they were held to it)."""
    means = [t.times.mean_s for t in done if t.measured and (t.candidate.exact or not exact)]
    return Watch(budget.began + budget.seconds, SLOWER_THAN_FASTEST * min(means) if means else None)


def _worth_starting(done: list[Trial], budget: Budget) -> bool:
    """Time left for a trial as long as the quickest so far (the start-up alone is most of a short one)."""
    walls = [t.wall_s for t in done if t.measured]
    return budget.left() > (min(walls) if walls else 0.0)


def unconfirmed_leader(search: Search) -> Trial | None:
    """The fastest exact or fastest overall configuration while it has only its screen: a winner is always
    measured over the second round's longer run, and one that fell back there makes room for the next."""
    confirmed = {t.candidate.name for t in search.confirmed}
    for leader in (search.best(exact_only=True), search.best(exact_only=False)):
        if leader is not None and leader.candidate.name not in confirmed:
            return leader
    return None


def autotune(
    base: RunSpec,
    candidates: list[Candidate],
    budget: Budget,
    steps: int,
    folder: Path,
    report,
    log: Console,
) -> Search:
    """report(round, trial): called after each trial (the CLI prints a line). log: where the trials' own
    run output goes."""
    search = Search()
    for i, candidate in enumerate(candidates):
        if not _worth_starting(search.screened, budget):
            search.not_tried = candidates[i:]
            break
        folder_i = folder / f"{i + 1:02d}-{candidate.name}"
        trial = run_trial(base, candidate, steps, folder_i, log, watch(search.screened, budget, candidate.exact))
        search.screened.append(trial)
        report(1, trial)
    while (leader := unconfirmed_leader(search)) is not None and len(search.confirmed) < CONFIRMED_AT_MOST:
        if budget.left() < CONFIRM_FACTOR * leader.wall_s:
            break
        name = leader.candidate.name
        again = run_trial(
            base,
            leader.candidate,
            CONFIRM_FACTOR * steps,
            folder / f"r2-{name}",
            log,
            watch([], budget, leader.candidate.exact),
        )
        search.confirmed.append(again)
        report(2, again)
    return search
