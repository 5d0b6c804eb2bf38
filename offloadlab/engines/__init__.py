"""The engine adapters: DeepSpeed and FSDP2 behind one `Engine` interface, and DeepSpeed's compiled ops.
`engine_class` is the one place a strategy type meets its engine; nothing outside this package asks which
engine a strategy uses, it asks the engine (`Engine`'s class methods)."""

from __future__ import annotations

from pathlib import Path

from offloadlab.engines.base import Engine
from offloadlab.engines.dist import DistContext
from offloadlab.spec import DeepSpeedStrategy, FSDP2Strategy, RunSpec, Strategy


def engine_class(strategy: Strategy) -> type[Engine]:
    """The engine a strategy runs on: the one place a strategy type is matched to its engine."""
    match strategy:
        case DeepSpeedStrategy():
            from offloadlab.engines.deepspeed_engine import DeepSpeedEngine

            return DeepSpeedEngine
        case FSDP2Strategy():
            from offloadlab.engines.fsdp2_engine import FSDP2Engine

            return FSDP2Engine
        case _:
            raise ValueError(f"unknown strategy type {type(strategy).__name__}")


def build_engine(spec: RunSpec, strategy: Strategy, ctx: DistContext, nvme_dir: Path | None) -> Engine:
    return engine_class(strategy).build(spec, strategy, ctx, nvme_dir)


__all__ = ["DistContext", "Engine", "build_engine", "engine_class"]
