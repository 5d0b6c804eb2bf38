"""What `autotune` shows and keeps: a line per trial as it ends, the ranked table, autotune.json, and the
fastest exact and fastest overall configurations as files for `offloadlab run` and users' own scripts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from offloadlab.autotune.search import Search
from offloadlab.autotune.trials import Trial
from offloadlab.engines.deepspeed.buffers import buffers_for
from offloadlab.plan.accounting import Placement, shape_of_spec
from offloadlab.plan.output import write_plan
from offloadlab.results.tables import fmt_or_dash
from offloadlab.spec import RunSpec


def trial_line(round_: int, trial: Trial) -> str:
    c = trial.candidate
    head = f"{'screen' if round_ == 1 else 'round 2'} {c.name}:"
    if not trial.measured:
        # A trial the search stopped (slower than the best, or out of time) did not fail: it was judged.
        stopped = (trial.reason or "").startswith("stopped")
        what = trial.reason if stopped else f"{trial.status.label} ({trial.reason})"
        return f"{head} {what} after {trial.wall_s:.0f} s"
    t = trial.times
    return (
        f"{head} {t.tokens_per_s:,.0f} tokens/s, step p50 {t.p50_s:.3f} s, max {t.max_s:.3f} s, "
        f"{t.stalls} stall{'' if t.stalls == 1 else 's'} ({trial.wall_s:.0f} s; predicted step "
        f"{c.prediction.step.seconds:.3g} s)"
    )


def ranked_table(search: Search) -> Table:
    ranked = search.ranked()
    best = ranked[0].tokens_per_s if ranked else None
    exact = search.best(exact_only=True)
    table = Table(title="autotune: measured, fastest first", title_justify="left")
    for column, justify in (
        ("configuration", "left"),
        ("exact", "left"),
        ("tokens/s", "right"),
        ("p50/p90/max s", "right"),
        ("stalls", "right"),
        ("loss vs exact", "right"),
    ):
        table.add_column(column, justify=justify, overflow="fold")
    for t in ranked:
        deviation = t.loss_deviation(exact) if exact and not t.candidate.exact else None
        table.add_row(
            t.candidate.name,
            "yes" if t.candidate.exact else "no",
            f"{t.tokens_per_s:,.0f}" + (f" ({t.tokens_per_s / best:.0%})" if best else ""),
            f"{t.times.p50_s:.3f}/{t.times.p90_s:.3f}/{t.times.max_s:.3f}",
            str(t.times.stalls),
            fmt_or_dash(None if deviation is None else 100 * deviation, "{:+.2g}%"),
        )
    return table


def record(search: Search) -> dict:
    """autotune.json: every trial, both rounds, and what was not tried."""

    def one(round_: int, t: Trial) -> dict:
        c = t.candidate
        return {
            "round": round_,
            "configuration": c.name,
            "placement": c.placement_name,
            "micro_batch": c.micro_batch,
            "grad_accum": c.grad_accum,
            "activation_checkpointing": c.prediction.placement.activation_checkpointing,
            "exact": c.exact,
            "predicted_step_s": c.prediction.step.seconds,
            "status": str(t.status),
            "reason": t.reason,
            "wall_s": t.wall_s,
            "run_dir": t.run_dir.name,
            "times": None if t.times is None else vars(t.times),
        }

    return {
        "trials": [one(1, t) for t in search.screened] + [one(2, t) for t in search.confirmed],
        "not_tried": [c.name for c in search.not_tried],
    }


def write_winner(trial: Trial, base: RunSpec, out_dir: Path, why: str) -> list[Path]:
    """The trial's configuration at the user's steps, as `plan --write` writes a placement."""
    c = trial.candidate
    spec = base.model_copy(update={"micro_batch": c.micro_batch, "grad_accum": c.grad_accum})
    placement = c.prediction.placement
    renamed = Placement(placement.strategy.model_copy(update={"name": c.name}), placement.activation_checkpointing)
    prediction = replace(c.prediction, placement=renamed)
    return write_plan(prediction, spec, out_dir, None, buffers_for(shape_of_spec(spec)), force=False, why=why)


def write_winners(search: Search, base: RunSpec, folder: Path) -> dict[str, list[Path]]:
    """best-exact/ and, when something inexact was faster, best-overall/ (its loss deviation in its header)."""
    out = {}
    exact, overall = search.best(exact_only=True), search.best(exact_only=False)
    if exact is not None:
        why = f"Written by offloadlab autotune: the fastest exact AdamW, {exact.tokens_per_s:,.0f} tokens/s"
        out["best-exact"] = write_winner(exact, base, folder / "best-exact", why)
    if overall is not None and overall is not exact:
        deviation = overall.loss_deviation(exact) if exact else None
        loss = (
            f"its last loss {100 * deviation:+.2g}% from exact AdamW's" if deviation is not None else "not exact AdamW"
        )
        why = f"Written by offloadlab autotune: the fastest, {overall.tokens_per_s:,.0f} tokens/s; {loss}"
        out["best-overall"] = write_winner(overall, base, folder / "best-overall", why)
    (folder / "autotune.json").write_text(json.dumps(record(search), indent=2) + "\n")
    return out
