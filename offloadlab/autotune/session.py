"""One `offloadlab autotune`: the plan, the search space, the folder, the search and the winners' files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from offloadlab.autotune.output import write_winners
from offloadlab.autotune.search import Budget, Search, autotune, duration_text, parse_budget
from offloadlab.autotune.space import search_space
from offloadlab.engines.ops import announce_on, ensure_built
from offloadlab.plan.inputs import PlanInputs, PlanRequest
from offloadlab.plan.output import not_planned_text
from offloadlab.run.runner import check_new_folder
from offloadlab.spec import RunSpec, SpecError

BUDGET_GONE = "the budget ran out before the first trial: planning and building took it; give a longer --budget"


@dataclass(frozen=True)
class AutotuneRequest:
    spec_path: Path
    budget: str
    steps: int
    out: Path
    only: frozenset[str] = frozenset()


@dataclass(frozen=True)
class AutotuneOutcome:
    spec: RunSpec
    search: Search
    written: dict[str, list[Path]]
    folder: Path


def autotune_spec(request: AutotuneRequest, console: Console, report) -> AutotuneOutcome:
    """report(round, trial) after each trial. Bad input is refused before any trial starts."""
    # The budget counts from here: the plan's probes and any op build are part of the time a user gave.
    budget = Budget(parse_budget(request.budget))
    if request.steps < 2:
        raise SpecError("--steps must be at least 2: the first steps of a trial are not counted, and one is no median")
    check_new_folder(request.out)
    inputs = PlanInputs.gather(PlanRequest(spec_path=request.spec_path), console)
    candidates = search_space(inputs, set(request.only))
    if not candidates:
        raise SpecError("the plan says nothing fits this machine at this batch: 'offloadlab plan SPEC' shows why")
    console.print(f"follow it live: offloadlab tui --root {request.out}", highlight=False)
    console.print(
        f"autotune: {len(candidates)} configurations fit ({inputs.title}); trying them in the plan's order "
        f"within {duration_text(budget.seconds)} (counted from the start), {request.steps} steps each after "
        "the start-up"
    )
    skipped = not_planned_text(inputs)
    if skipped:  # a spec's strategy this machine would refuse (torchao on a CPU host) is not tried: say so
        console.print(skipped, highlight=False, markup=False)
    ensure_built({op for c in candidates for op in c.prediction.placement.strategy.ops_needed}, announce_on(console))
    if budget.left() <= 0:
        raise SpecError(BUDGET_GONE)
    request.out.mkdir(parents=True, exist_ok=True)
    log = Console(quiet=True)  # the trials' own run output: their logs and stores keep it
    search = autotune(inputs.spec, candidates, budget, request.steps, request.out, report, log)
    written = write_winners(search, inputs.spec, request.out)
    return AutotuneOutcome(inputs.spec, search, written, request.out)
