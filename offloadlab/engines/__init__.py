"""The engines offloadlab drives, one folder each with the same file names:

    adapter.py      builds and trains the strategy on a rank (torch): a subclass of `base.Engine`
    config.py       the engine's own config files for users' scripts, Accelerate's sections (no torch)
    planner.py      the planner's model of it: bytes by place, bytes over each link, its optimizer phase
    placements.py   the placements the planner proposes, and the variants it weighs where one does not fit

and `ENGINES`, the one registry: a record per engine naming its strategy type and the name of its adapter
class. Everything else asks the registry (`engine_for(strategy)`) for an engine's parts, which are imported
only when asked for, so that the read side (compare, report, the TUI) stays torch-free. Adding an engine
is its strategy type in spec.py, its folder here, and its line in `ENGINES`.

Shared by every engine: base.py (the `Engine` interface), protocols.py (the planner, placements and
exporter interfaces), dist.py, digests.py, ops.py (DeepSpeed's compiled ops, which FSDP2 can use for its
CPU Adam). May import: checks, plan, results, spec, telemetry, workload.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from offloadlab.spec import DeepSpeedStrategy, FSDP2Strategy, Strategy, TorchAOStrategy

if TYPE_CHECKING:
    from offloadlab.engines.base import Engine
    from offloadlab.engines.protocols import EngineExporter, EnginePlacements, EnginePlanner


@dataclass(frozen=True)
class EngineRecord:
    name: str
    """The spec's `engine` value, and the folder's name."""
    strategy_type: type
    adapter_class: str
    """The `Engine` subclass in the folder's adapter.py."""
    restores_at_other_world_size: bool = False
    """Whether a checkpoint saved by N ranks loads into another number of ranks as it is."""
    extra: str | None = None
    """The package the engine needs beyond offloadlab's own dependencies, installed by offloadlab's extra
    of the same name (`pip install 'offloadlab[torchao]'`)."""

    @property
    def installed(self) -> bool:
        """Whether the package the engine needs beyond offloadlab's own is installed."""
        return self.extra is None or importlib.util.find_spec(self.extra) is not None

    def _module(self, role: str) -> ModuleType:
        return importlib.import_module(f"{__name__}.{self.name}.{role}")

    def adapter(self) -> type[Engine]:
        """The engine itself (imports torch and the engine's library)."""
        return getattr(self._module("adapter"), self.adapter_class)

    @property
    def planner(self) -> EnginePlanner:
        return self._module("planner")

    @property
    def placements(self) -> EnginePlacements:
        return self._module("placements")

    @property
    def exporter(self) -> EngineExporter:
        return self._module("config")


ENGINES = (
    # DeepSpeed's checkpoints hold each rank's partition: another world size needs its universal-checkpoint
    # conversion first, which offloadlab does not run. FSDP2's (DCP) reshard on load.
    EngineRecord("deepspeed", DeepSpeedStrategy, "DeepSpeedEngine"),
    EngineRecord("fsdp2", FSDP2Strategy, "FSDP2Engine", restores_at_other_world_size=True),
    EngineRecord("torchao", TorchAOStrategy, "TorchAOEngine", extra="torchao"),
)


def engine_for(strategy: Strategy) -> EngineRecord:
    """The engine a strategy runs on: the one place a strategy type is matched to its engine."""
    for record in ENGINES:
        if isinstance(strategy, record.strategy_type):
            return record
    raise ValueError(f"no engine for strategy type {type(strategy).__name__}")
