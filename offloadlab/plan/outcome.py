"""One `offloadlab plan`: gather what it plans for, find the largest GPT that fits when asked, rank every
placement, and pick the one `--write` writes."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console

from offloadlab.plan.accounting import Shape
from offloadlab.plan.inputs import PlanInputs, PlanRequest
from offloadlab.plan.predict import Prediction, largest_model, one_more_layer, plan
from offloadlab.spec import SpecError
from offloadlab.workload.model import PRESETS


@dataclass(frozen=True)
class PlanOutcome:
    inputs: PlanInputs
    predictions: list[Prediction]
    past_largest: tuple[Shape, list[Prediction]] | None = None
    """With --largest: the shape with one more layer, and the plan there (where each placement stops)."""


def plan_request(request: PlanRequest, console: Console, largest: bool = False) -> PlanOutcome:
    """largest: plan the largest GPT some placement fits on the machine instead of the request's model."""
    inputs = PlanInputs.gather(request, console)
    past = None
    if largest:
        found = largest_model(PRESETS, inputs.shape_of, inputs.machine, inputs.links)
        if found is None:
            raise SpecError("not even the smallest preset fits this machine")
        inputs = inputs.with_model(*found)
        past = one_more_layer(found[0], inputs.shape_of, inputs.machine, inputs.links)
    predictions = plan(inputs.shape, inputs.machine, inputs.links, inputs.buffers, also=inputs.spec_placements)
    return PlanOutcome(inputs, predictions, past)


def placement_to_write(predictions: list[Prediction], chosen: str | None) -> Prediction:
    """The placement named chosen, else the winner (the first that fits)."""
    if chosen:
        pick = next((x for x in predictions if x.placement.name == chosen), None)
        if pick is None:
            names = ", ".join(x.placement.name for x in predictions)
            raise SpecError(f"--strategy {chosen!r} is not one of the planned placements: {names}")
        return pick
    pick = next((x for x in predictions if x.fits), None)
    if pick is None:
        raise SpecError("nothing fits: nothing to write")
    return pick
