"""Engine adapters: `build_engine` is the one place a strategy becomes a running engine."""

from __future__ import annotations

from pathlib import Path

from offloadlab.engines.base import DistContext, Engine
from offloadlab.spec import DeepSpeedStrategy, FSDP2Strategy, RunSpec


def build_engine(spec: RunSpec, strategy: DeepSpeedStrategy | FSDP2Strategy, ctx: DistContext, nvme_dir: Path | None) -> Engine:
    match strategy:
        case DeepSpeedStrategy():
            from offloadlab.engines.deepspeed_engine import build_deepspeed

            return build_deepspeed(spec, strategy, ctx, nvme_dir)
        case FSDP2Strategy():
            from offloadlab.engines.fsdp2_engine import build_fsdp2

            return build_fsdp2(spec, strategy, ctx)
        case _:
            raise ValueError(f"unknown strategy type {type(strategy).__name__}")


__all__ = ["DistContext", "Engine", "build_engine"]
