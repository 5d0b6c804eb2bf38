"""`offloadlab autotune`: its search space from the planner, the budget, the early stop read from a real store,
and real searches over tiny models through DeepSpeed and FSDP2 on the CPU."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import tomli_w
from rich.console import Console

from conftest import cli, flat
from offloadlab.autotune.search import Budget, duration_text, parse_budget, watch
from offloadlab.autotune.space import search_space, splits
from offloadlab.autotune.trials import Trial, _too_slow
from offloadlab.plan.inputs import PlanInputs, PlanRequest
from offloadlab.results.figures import StepTimes
from offloadlab.results.status import Status
from offloadlab.results.store import RunStore, StepRecord
from offloadlab.spec import SpecError, load_spec, parse_spec

BF16_128_TOKENS = dict(name="t", seed=0, steps=4, seq_len=32, global_batch_tokens=128, precision="bf16")


def _spec(tmp_path: Path, **overrides) -> Path:
    """A tiny GPT spec giving tokens per step, not the split: autotune chooses it."""
    raw = {**BF16_128_TOKENS, **overrides, "model": dict(preset="tiny"), "strategy": [dict(name="a", engine="fsdp2")]}
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


@pytest.mark.parametrize(
    ("text", "seconds"), [("20m", 1200), ("90s", 90), ("1h30m", 5400), ("45", 2700), ("2m30s", 150)]
)
def test_budget_reads_hours_minutes_and_seconds(text, seconds):
    assert parse_budget(text) == seconds


def test_a_budget_is_shown_as_it_was_given():
    assert [duration_text(parse_budget(t)) for t in ("90s", "20m", "1h30m", "1h", "1s")] == [
        "1 min 30 s", "20 min", "1 h 30 min", "1 h", "1 s"
    ]  # fmt: skip


@pytest.mark.slow
def test_a_budget_gone_before_the_first_trial_is_refused_with_the_fix(tmp_path):
    """The budget counts from the start: 1 s is spent by the plan. One line naming the fix, exit 2, no empty
    table, no folder made."""
    out = tmp_path / "tuned"
    result = cli("autotune", str(_spec(tmp_path)), "--budget", "1s", "--out", str(out), check=False)
    assert result.returncode == 2 and "give a longer --budget" in result.stderr
    assert "measured, fastest first" not in result.stdout and not out.exists()


@pytest.mark.parametrize("text", ["", "20 minutes", "m", "-5m"])
def test_a_budget_it_cannot_read_names_the_forms_it_takes(text):
    with pytest.raises(SpecError, match="give a time such as 20m, 90s or 1h30m"):
        parse_budget(text)


def test_splits_keep_the_samples_and_try_powers_of_two_and_the_whole():
    assert splits(4) == [(1, 4), (2, 2), (4, 1)]
    assert splits(6) == [(1, 6), (2, 3), (6, 1)]
    assert all(m * a == 24 for m, a in splits(24))


def test_global_batch_tokens_alone_is_one_micro_batch_and_must_agree_with_a_given_split():
    base = dict(seq_len=32, model=dict(preset="tiny"), strategy=[dict(name="a", engine="fsdp2")])
    alone = parse_spec({**base, "global_batch_tokens": 256, "nproc": 2})
    assert (alone.micro_batch, alone.grad_accum, alone.tokens_per_step) == (4, 1, 256)
    with pytest.raises(SpecError, match=r"must be seq_len \* micro_batch \* grad_accum \* nproc \(now 128\)"):
        parse_spec({**base, "global_batch_tokens": 256, "micro_batch": 2, "grad_accum": 2})
    with pytest.raises(SpecError, match="must be a multiple of seq_len \\* nproc = 32"):
        parse_spec({**base, "global_batch_tokens": 100})


def test_the_search_space_is_what_the_plan_fits_at_every_split_each_placement_first_at_its_best(tmp_path):
    inputs = PlanInputs.gather(PlanRequest(spec_path=_spec(tmp_path)), Console(quiet=True))
    candidates = search_space(inputs)
    assert {(c.micro_batch, c.grad_accum) for c in candidates} == {(1, 4), (2, 2), (4, 1)}
    assert all(c.prediction.fits for c in candidates)
    names = [c.placement_name for c in candidates]
    placements = list(dict.fromkeys(names))
    # Every placement is tried once before any is tried at its second split.
    assert names[: len(placements)] == placements
    # In each round exact and inexact placements take turns, an exact one first, so that a short budget
    # has both picks and an inexact trial an exact one to be judged against.
    exact = [c.exact for c in candidates[: len(placements)]]
    turns = 2 * min(exact.count(True), exact.count(False))
    assert turns and exact[:turns] == [True, False] * (turns // 2)
    # bf16 master weights are weighed for each ZeRO placement stepping on the CPU; ZenFlow needs CUDA.
    assert {"zero2-cpu-bf16master", "zero1-cpu-bf16master", "zero3-opt-cpu-bf16master"} <= set(names)
    assert not [n for n in names if "zenflow" in n]
    assert {c.exact for c in candidates if c.placement_name.endswith("bf16master")} == {False}

    only = search_space(inputs, {"fsdp2", "zero2-cpu"})
    assert {c.placement_name for c in only} == {"fsdp2", "zero2-cpu"}
    with pytest.raises(SpecError, match="--only zero9: not a placement the plan says fits"):
        search_space(inputs, {"zero9"})


def test_an_exact_configuration_is_held_to_the_fastest_exact_one_only(tmp_path):
    """On an H200 ZenFlow's 0.17 s steps stopped every exact trial (0.6 s) when each was held to the fastest
    of all, and no fastest exact configuration was found."""
    inputs = PlanInputs.gather(PlanRequest(spec_path=_spec(tmp_path)), Console(quiet=True))
    candidates = search_space(inputs)
    inexact, exact = (next(c for c in candidates if c.exact is e) for e in (False, True))

    def trial(candidate, step_s: float) -> Trial:
        steps = [
            StepRecord(i, 1.0, i * step_s, (i + 1) * step_s, 128 / step_s, None, None, None, 0, 0, 0) for i in range(4)
        ]
        return Trial(candidate, tmp_path, Status.DONE, None, 10.0, StepTimes.of_steps(steps), {})

    done = [trial(inexact, 0.17)]
    assert watch(done, Budget(60.0), exact=True).slowest_step_s is None
    assert watch(done, Budget(60.0), exact=False).slowest_step_s == pytest.approx(2 * 0.17)
    done.append(trial(exact, 0.6))
    assert watch(done, Budget(60.0), exact=True).slowest_step_s == pytest.approx(2 * 0.6)
    assert watch(done, Budget(60.0), exact=False).slowest_step_s == pytest.approx(2 * 0.17)


def _store_with_steps(run_dir: Path, step_seconds: list[float], last_ended_ago: float) -> None:
    store = RunStore(run_dir, create_schema=True)
    strategy_id = store.add_strategy(store.add_run("t", ""), "s", "fsdp2", {}, 10)
    end = time.time() - last_ended_ago
    for step, seconds in reversed(list(enumerate(step_seconds, start=1))):
        store.add_step(strategy_id, 0, StepRecord(step, 1.0, end - seconds, end, 1.0, None, None, None, 0, 0, 0))
        end -= seconds
    store.close()


@pytest.mark.parametrize(
    ("steps", "ended_ago", "verdict"),
    [
        ([9.0, 0.5, 0.5], 0.0, None),  # the start-up step is not counted
        ([0.1, 3.0, 3.0], 0.0, "its steps took 3 s on average"),
        ([0.1, 3.0], 0.0, None),  # one counted step is not a verdict
        ([0.1, 0.5], 30.0, "its step 3 ran past 3 s"),  # the step it is in
        ([0.1, 0.5], 2.0, None),
        ([0.1, 0.5, 0.5, 0.5], 30.0, None),  # its last step is done: it is ending, not slow (an H100 trial was)
    ],
)
def test_a_trial_is_stopped_from_what_its_store_holds(tmp_path, steps, ended_ago, verdict):
    _store_with_steps(tmp_path, steps, ended_ago)
    assert _too_slow(tmp_path, start_up=1, total_steps=4, slowest_step_s=1.5) == verdict


def test_no_store_yet_is_no_verdict(tmp_path):
    assert _too_slow(tmp_path, start_up=1, total_steps=4, slowest_step_s=0.001) is None


@pytest.mark.slow
def test_autotune_measures_each_configuration_and_writes_the_fastest_exact_one(tmp_path):
    """Two placements at two splits of 64 tokens, real steps through FSDP2 and DeepSpeed's CPU Adam."""
    spec = _spec(tmp_path, global_batch_tokens=64)
    out = tmp_path / "tuned"
    result = cli(
        "autotune",
        str(spec),
        "--only",
        "fsdp2,zero2-cpu-bf16master",
        "--steps",
        "2",
        "--budget",
        "8m",
        "--out",
        str(out),
    )
    record = json.loads((out / "autotune.json").read_text())
    screened = [t for t in record["trials"] if t["round"] == 1]
    assert {(t["placement"], t["micro_batch"], t["grad_accum"]) for t in screened} == {
        (p, m, a) for p in ("fsdp2", "zero2-cpu-bf16master") for m, a in ((1, 2), (2, 1))
    }
    for t in screened:
        assert t["status"] == "done" and t["times"]["p50_s"] > 0 or "stopped early" in t["reason"]
    measured = [t for t in record["trials"] if t["status"] == "done"]
    latest = {t["configuration"]: t for t in measured}  # a second round replaces the screen's figures
    best_exact = max((t for t in latest.values() if t["exact"]), key=lambda t: t["times"]["tokens_per_s"])
    assert any(t["round"] == 2 and t["configuration"] == best_exact["configuration"] for t in record["trials"])

    written = out / "best-exact" / f"{best_exact['configuration']}.toml"
    assert written.read_text().startswith("# Written by offloadlab autotune: the fastest exact AdamW")
    winner = load_spec(written)
    assert winner.tokens_per_step == 64 and winner.strategy[0].exact
    assert (winner.micro_batch, winner.grad_accum) == (best_exact["micro_batch"], best_exact["grad_accum"])
    assert (out / "best-exact" / f"{best_exact['configuration']}_accelerate.yaml").is_file()
    overall = out / "best-overall"
    if overall.exists():  # bf16 master weights were faster here: its file says how far its loss went
        assert "from exact AdamW's" in next(overall.glob("*.toml")).read_text().splitlines()[0]
    # Each trial is a run folder the TUI and compare read; nothing of a trial's scratch is left.
    for trial_dir in (p for p in out.iterdir() if p.is_dir() and p.name[0].isdigit()):
        assert {p.name for p in trial_dir.iterdir()} <= {"offloadlab.sqlite", "spec.toml", "logs"}
    assert "best-exact:" in flat(result.stdout) and "autotune: measured, fastest first" in result.stdout


@pytest.mark.slow
def test_a_budget_that_runs_out_stops_the_trial_and_names_what_was_not_tried(tmp_path):
    """The budget counts from the command's start (the plan's probes take part of it): 5 s leaves a trial
    started and not finished (of 2,000 steps: the default 6 of the tiny model fit in 5 s on a fast host)."""
    out = tmp_path / "tuned"
    args = ("--only", "fsdp2", "--budget", "5s", "--steps", "2000", "--out", str(out))
    result = cli("autotune", str(_spec(tmp_path)), *args, check=False)
    assert result.returncode == 1
    text = flat(result.stdout + result.stderr)
    assert "stopped: the time budget ran out" in text
    assert "not tried within the budget: fsdp2-mb" in text
    assert "no configuration finished its steps" in text
    for first in out.glob("01-*"):  # made unless the budget ended before the trial's run began
        assert {p.name for p in first.iterdir()} <= {"offloadlab.sqlite", "spec.toml", "logs"}
