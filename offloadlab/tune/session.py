"""One `offloadlab tune`, start to end: check the output folder, sweep the drive with each point written to
the folder's store as it is measured (so the TUI shows it live), size the spec's swap buffers, write the
fragments and mark the store done. On any failure or Ctrl-C what the tune made is removed again."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from offloadlab.engines.deepspeed.buffers import SwapBuffers, pinned_swap_bytes, tuned_buffers
from offloadlab.plan.accounting import shape_of_spec
from offloadlab.results.rundir import RunDir, signals_ignored
from offloadlab.results.status import Status
from offloadlab.spec import DeepSpeedStrategy, RunSpec, SpecError, load_spec
from offloadlab.tune.folder import TuneFolder
from offloadlab.tune.fragment import write_fragments
from offloadlab.tune.search import READ_SHARE, PointResult, Tuner, TuneResult, TuneSettings


class TuneInterrupted(Exception):
    """Ctrl-C during a tune, after its files were removed."""

    def __init__(self, folder_kept: bool):
        super().__init__("interrupted")
        self.folder_kept = folder_kept
        """The folder the tune made stays: it holds files the tune did not write."""


@dataclass(frozen=True)
class TuneRequest:
    nvme_path: Path
    workload: str
    quick: bool
    out_dir: Path
    force: bool
    spec_path: Path | None = None
    """Also size the parameter swap buffers of this spec's NVMe strategy."""


@dataclass(frozen=True)
class TuneOutcome:
    result: TuneResult
    out_dir: Path
    fragment_toml: Path
    fragment_json: Path
    spec: RunSpec | None
    nvme_strategy: DeepSpeedStrategy | None
    buffers: SwapBuffers | None
    """The swap buffers sized for the spec's NVMe strategy with the best point; None without a spec."""

    @property
    def pinned_swap_bytes(self) -> float | None:
        """What DeepSpeed will pin for those buffers, per host."""
        if self.buffers is None:
            return None
        return pinned_swap_bytes(self.nvme_strategy, shape_of_spec(self.spec), self.spec.nproc, self.buffers)

    def as_json(self) -> dict:
        result = self.result
        return {
            "fragment": str(self.fragment_toml),
            "best": result.best.point.model_dump(),
            "read_gbps": result.best.read_gbps,
            "write_gbps": result.best.write_gbps,
            "pcie": dataclasses.asdict(result.pcie) if result.pcie else None,
            "direct_io": dataclasses.asdict(result.direct_io),
            "seconds": result.seconds,
            "points": [p.as_dict() for p in result.records()],
            "swap_buffers": self.buffers
            and {**dataclasses.asdict(self.buffers), "pinned_bytes": self.pinned_swap_bytes},
        }


def nvme_param_strategy(spec: RunSpec) -> DeepSpeedStrategy:
    """The spec's strategy with its parameters on NVMe: the one whose swap buffers a tune sizes."""
    for strategy in spec.strategy:
        if strategy.swaps_parameters:
            return strategy
    raise SpecError(
        f"--spec: no strategy of {spec.name!r} has offload_param = \"nvme\"; swap buffers only matter there"
    )


OnPoint = Callable[[str, PointResult, int, int], None]
"""(stage, the point just measured, points measured, points expected)."""


def tune_drive(request: TuneRequest, on_point: OnPoint, announce_build: Callable[[str], None]) -> TuneOutcome:
    """The whole tune; raises SpecError (bad input, before anything is made) or TuneInterrupted."""
    folder = TuneFolder(RunDir.at(request.out_dir))
    try:
        folder.check(request.force)
        spec = load_spec(request.spec_path) if request.spec_path else None
        nvme_strategy = nvme_param_strategy(spec) if spec else None
        tuner = Tuner(
            request.nvme_path, request.workload, TuneSettings.for_mode(request.quick), announce_build=announce_build
        )
        # Checked before the folder is made: a bad drive or a Ctrl-C while the op loads leaves nothing to undo.
        tuner.preflight()
        store, run_id = folder.open()

        def record(stage: str, point: PointResult, done: int, expected: int) -> None:
            store.upsert_tune_points(run_id, [point.record(READ_SHARE[request.workload])])
            on_point(stage, point, done, expected)

        tuner.on_progress = record
        result = tuner.run()
    except BaseException as err:  # the tuner removed its own files; this removes what the tune made
        with signals_ignored():
            kept = folder.remove()
        if isinstance(err, KeyboardInterrupt):
            raise TuneInterrupted(kept) from None
        raise
    buffers = tuned_buffers(spec, nvme_strategy, result.best.point) if nvme_strategy else None
    toml_path, json_path = write_fragments(result, buffers, folder.out_dir.root)
    store.set_run_spec(run_id, toml_path.read_text())
    store.upsert_tune_points(run_id, result.records())
    store.set_run_status(run_id, Status.DONE)
    return TuneOutcome(result, folder.out_dir.root, toml_path, json_path, spec, nvme_strategy, buffers)
