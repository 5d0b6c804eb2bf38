"""The configurations `autotune` tries: every placement the planner says fits, at every split of the step's
samples into micro-batch x accumulation, the engines' inexact options beside the exact ones; ordered so
that a budget cut short has still tried each placement at its best predicted split."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest

from offloadlab.engines import engine_for
from offloadlab.engines.deepspeed.buffers import buffers_for
from offloadlab.plan.accounting import shape_of_spec
from offloadlab.plan.inputs import PlanInputs
from offloadlab.plan.predict import Prediction, candidate_placements, plan
from offloadlab.spec import RunSpec, SpecError


@dataclass(frozen=True)
class Candidate:
    prediction: Prediction
    micro_batch: int
    grad_accum: int

    @property
    def placement_name(self) -> str:
        """The placement without the planner's "+ac" (activation checkpointing is part of the split's fit)."""
        return self.prediction.placement.name.removesuffix("+ac")

    @property
    def name(self) -> str:
        ac = "-ac" if self.prediction.placement.activation_checkpointing else ""
        return f"{self.placement_name}-mb{self.micro_batch}x{self.grad_accum}{ac}"

    @property
    def exact(self) -> bool:
        return self.prediction.placement.strategy.exact

    def spec(self, base: RunSpec, steps: int) -> RunSpec:
        """The base spec with this configuration as its one strategy, trained `steps` steps, no checkpoint."""
        placement = self.prediction.placement
        model = base.model.model_copy(update={"activation_checkpointing": placement.activation_checkpointing})
        strategy = placement.strategy.model_copy(update={"name": self.name})
        return base.model_copy(
            update=dict(
                name=self.name,
                steps=steps,
                micro_batch=self.micro_batch,
                grad_accum=self.grad_accum,
                verify_checkpoint=False,
                checkpoint_step=0,
                model=model,
                strategy=[strategy],
            )
        )


def splits(samples_per_rank: int) -> list[tuple[int, int]]:
    """(micro_batch, grad_accum) pairs that make samples_per_rank: micro-batches of powers of two, and all."""
    sizes = [m for m in range(1, samples_per_rank + 1) if samples_per_rank % m == 0]
    return [(m, samples_per_rank // m) for m in sizes if m & (m - 1) == 0 or m == samples_per_rank]


def _inexact_options(prediction_placements, precision: str, on_cuda: bool, grad_accum: int) -> tuple:
    return tuple(
        option
        for p in prediction_placements
        for option in engine_for(p.strategy).placements.inexact_options(p, precision, on_cuda, grad_accum)
    )


def search_space(inputs: PlanInputs, only: set[str] | None = None) -> list[Candidate]:
    """Every fitting configuration at the spec's tokens per step, in the order to try them. only: the
    placement names to keep (as `plan` names them, with the options' suffixes)."""
    spec = inputs.spec
    on_cuda = inputs.machine.gpu_name is not None
    found: list[Candidate] = []
    for micro_batch, grad_accum in splits(spec.micro_batch * spec.grad_accum):
        split = spec.model_copy(update={"micro_batch": micro_batch, "grad_accum": grad_accum})
        shape = shape_of_spec(split)
        also = inputs.spec_placements + _inexact_options(
            candidate_placements() + list(inputs.spec_placements), spec.precision, on_cuda, grad_accum
        )
        for x in plan(shape, inputs.machine, inputs.links, buffers_for(shape), also=also):
            if x.fits and x.step and (not only or x.placement.name.removesuffix("+ac") in only):
                found.append(Candidate(x, micro_batch, grad_accum))
    if only:
        unknown = only - {c.placement_name for c in found}
        if unknown:
            raise SpecError(
                f"--only {', '.join(sorted(unknown))}: not a placement the plan says fits; 'offloadlab plan SPEC' "
                "lists them (the inexact options add -bf16master to ZeRO and torchao placements stepping on the "
                "CPU in bf16 runs, and -zenflow on CUDA; torchao-cpu-offload needs one CUDA GPU and torchao installed)"
            )
    return tried_first(found)


def tried_first(found: list[Candidate]) -> list[Candidate]:
    """Each placement's best predicted split first, then each one's second best, and so on: the planner ranks
    placements well and splits less so (its step is a lower bound). Within a round, exact and inexact
    placements take turns, an exact one first: an inexact winner is judged by its loss against an exact
    trial's, and a short budget then has both picks (ZenFlow's trial alone, first update included, took
    109 s of a 1.42B GPT's search on an H100, where ZeRO-2's took 43 s)."""
    by_placement: dict[str, list[Candidate]] = {}
    for c in sorted(found, key=lambda c: c.prediction.step.seconds):
        by_placement.setdefault(c.placement_name, []).append(c)
    rounds = max((len(v) for v in by_placement.values()), default=0)
    order: list[Candidate] = []
    for i in range(rounds):
        in_round = [group[i] for group in by_placement.values() if i < len(group)]
        exact = [c for c in in_round if c.exact]
        inexact = [c for c in in_round if not c.exact]
        order += [c for pair in zip_longest(exact, inexact) for c in pair if c is not None]
    return order
