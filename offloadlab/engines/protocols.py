"""The interfaces each engine's folder implements, named once. An engine's planner.py, placements.py and
config.py are modules that satisfy these (a test checks every engine's modules against them); its
adapter.py holds a subclass of `engines.base.Engine`. No torch."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from offloadlab.plan.accounting import Links, Memory, Placement, Shape
from offloadlab.spec import RunSpec


class EnginePlanner(Protocol):
    """The planner's model of an engine: what it keeps where, and what it moves over which link."""

    def memory(self, p: Placement, shape: Shape, world: int, buffers: object | None, on_gpu: bool) -> Memory:
        """Bytes per rank by place; `buffers`: the engine's swap buffers where it has any."""

    def pinned_buffers(self, p: Placement, shape: Shape, world: int, buffers: object | None) -> list[float]:
        """Bytes of each buffer the engine page-locks for a rank."""

    def step_bytes(self, p: Placement, shape: Shape, world: int) -> dict[str, float]:
        """Bytes per optimizer step over each link: nvme_read, nvme_write (per host), pcie_h2d, pcie_d2h."""

    def param_upload_bytes(self, p: Placement, shape: Shape, world: int) -> float:
        """Of pcie_h2d, the updated parameters uploaded after the optimizer."""

    def param_nvme_read_bytes(self, p: Placement, shape: Shape, world: int) -> float:
        """Of nvme_read, the parameters fetched for forward and backward."""

    def optimizer_phase(
        self, p: Placement, shape: Shape, world: int, links: Links, swap_read: float, swap_write: float
    ) -> dict[str, float]:
        """Seconds of each part of the optimizer phase."""

    def serial_in_training(self, p: Placement, shape: Shape, world: int, links: Links) -> dict[str, float]:
        """Seconds of host work forward and backward wait on."""

    def overlapped_with_training(self, p: Placement) -> tuple[str, ...]:
        """Optimizer parts that run beside the next steps' training."""

    def checkpoint_bytes(self, strategy, n_params: int, param_bytes: int) -> int:
        """Run-folder bytes at the peak of a strategy's checkpoint save and restore check."""

    def swap_bytes(self, strategy, n_params: int, param_bytes: int) -> int:
        """Bytes a strategy keeps in its NVMe swap folder, all ranks of one host."""


class EnginePlacements(Protocol):
    """The placements the planner proposes for an engine, and those it weighs where one does not fit."""

    def candidates(self) -> list[Placement]: ...

    def when_host_ram_binds(self, p: Placement) -> list[Placement]: ...

    def partial_offloads(self, p: Placement, shape: Shape, world: int, spare_gpu_bytes: float) -> list[Placement]: ...

    def inexact_options(self, p: Placement, precision: str, on_cuda: bool, grad_accum: int) -> list[Placement]:
        """Faster variants of an exact placement that do not apply exact AdamW, for `autotune` to weigh."""


class EngineExporter(Protocol):
    """What `plan --write` writes for users' own scripts beside the run spec."""

    def file_names(self, name: str) -> list[str]:
        """The files export writes for a placement called name (checked before anything is written)."""

    def export(self, spec: RunSpec, out_dir: Path, name: str) -> list[str]:
        """Writes file_names(name) into out_dir for the spec's one strategy; its Accelerate config lines."""
