"""What `offloadlab run` checks of a spec before it starts a process: the NVMe folder, swap buffers against
the largest parameter, the parameters DeepSpeed holds at once and the page-locking limit, and disk for every
strategy's swap and checkpoint."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from offloadlab.checks.host import (
    PreflightError,
    check_direct_io,
    check_directory,
    check_free_disk,
    check_memlock,
    check_writable,
    nearest_existing,
)
from offloadlab.engines import engine_for
from offloadlab.engines.deepspeed.buffers import (
    params_held_at_turn,
    swap_buffer_bytes,
    swap_buffers_of,
    swapped_numels,
)
from offloadlab.plan.accounting import GiB, Machine, Placement, Shape, shape_of_spec
from offloadlab.spec import DeepSpeedStrategy, RunSpec
from offloadlab.train.cores import cores_for_rank
from offloadlab.train.gpu_budget import holds_a_gpu_of


def check_buffer_fits_largest_param(strategy: DeepSpeedStrategy, largest_param_numel: int) -> None:
    if strategy.offload_param == "nvme" and strategy.buffer_size < largest_param_numel:
        raise PreflightError(
            f"strategy {strategy.name}: buffer_size = {strategy.buffer_size:,} elements is smaller than the largest "
            f"parameter ({largest_param_numel:,} elements, usually the embedding): "
            f"set buffer_size >= {largest_param_numel}"
        )


def check_buffers_hold_the_turn(spec: RunSpec, strategy: DeepSpeedStrategy, shape: Shape) -> None:
    """Too few parameter swap buffers pass the first forward and backward (DeepSpeed traces it, one module
    at a time) and stop the second, after minutes at scale: refused here instead."""
    if not strategy.swaps_parameters:
        return
    needed = params_held_at_turn(swapped_numels(shape, strategy, spec.nproc, strategy.aio), strategy)
    if strategy.buffer_count < needed:
        raise PreflightError(
            f"strategy {strategy.name}: buffer_count = {strategy.buffer_count} is too few: where forward turns "
            f"into backward DeepSpeed holds every swapped parameter used again within stage3_max_reuse_distance "
            f"({strategy.stage3_max_reuse_distance:,} elements), {needed} buffers here, and would stop after the "
            f"first micro-batch with 'Not enough buffers'. Set buffer_count >= {needed}, or lower "
            "stage3_max_reuse_distance (`offloadlab tune --nvme DIR --spec SPEC` sizes both)"
        )


def check_swap_buffers_lockable(spec: RunSpec, strategy: DeepSpeedStrategy, shape: Shape) -> None:
    """DeepSpeed page-locks a rank's NVMe swap buffers with mlock: without CAP_IPC_LOCK they must fit
    `ulimit -l`, or the rank aborts at start ("mlock failed to allocate"). Whether they fit the RAM is the
    plan's fit check, which `--force` overrides."""
    placement = Placement(strategy, spec.model.activation_checkpointing)
    sizes = swap_buffer_bytes(placement, shape, spec.nproc, swap_buffers_of(strategy, shape)).values()
    try:
        check_memlock(int(sum(size for buffers in sizes for size in buffers)))
    except PreflightError as err:
        raise PreflightError(f"strategy {strategy.name}'s NVMe swap buffers: {err}") from None


def check_disk_for_run(spec: RunSpec, run_dir: Path, n_params: int) -> None:
    """Strategies run one after another and each one's swap folder and checkpoint are removed after it:
    the largest strategy must fit, swap and checkpoint together where both are on one filesystem."""
    param_bytes = 2 if spec.precision == "bf16" else 4
    run_fs = nearest_existing(run_dir)
    nvme_fs = spec.nvme_path if any(s.uses_nvme for s in spec.strategy) else None
    same_fs = nvme_fs is not None and os.stat(nvme_fs).st_dev == os.stat(run_fs).st_dev
    for strategy in spec.strategy:
        planner = engine_for(strategy).planner  # not the adapter: that imports the engine's library (1.5-2.4 s)
        swap = 1.1 * planner.swap_bytes(strategy, n_params, param_bytes)
        checkpoint = planner.checkpoint_bytes(strategy, n_params, param_bytes) if spec.verify_checkpoint else 0
        fix = " (or set verify_checkpoint = false, or pass --out on another drive)" if checkpoint else ""
        try:
            if same_fs:
                check_free_disk(
                    nvme_fs, int(swap + checkpoint), f"strategy {strategy.name!r}: nvme_path (swap + checkpoint)"
                )
            else:
                if swap:
                    check_free_disk(nvme_fs, int(swap), f"strategy {strategy.name!r}: nvme_path (swap)")
                if checkpoint:
                    check_free_disk(run_fs, int(checkpoint), f"strategy {strategy.name!r}: run directory (checkpoint)")
        except PreflightError as err:
            raise PreflightError(f"{err}{fix}") from None


def check_gpu_only_strategies(spec: RunSpec) -> None:
    import torch

    if torch.cuda.is_available():
        return
    for strategy in spec.strategy:
        if strategy.needs_cuda:
            raise PreflightError(
                f"strategy {strategy.name}: {strategy.needs_cuda}, and this machine has none: run it on a GPU "
                "machine, or remove the strategy here"
            )


def check_engine_packages(spec: RunSpec) -> None:
    for strategy in spec.strategy:
        engine = engine_for(strategy)
        if not engine.installed:
            raise PreflightError(
                f"strategy {strategy.name}: engine {strategy.engine!r} needs the {engine.extra} package, which is "
                f"not installed: pip install 'offloadlab[{engine.extra}]'"
            )


def preflight_run(spec: RunSpec, run_dir: Path) -> Shape:
    """Everything `offloadlab run` can check before it starts a process; run_dir need not exist yet.
    Returns the model's shape, which the fit check reads too (built once: an HF config is read for it)."""
    check_writable(run_dir, "run folder (--out)")
    if spec.model.is_hf:
        from offloadlab.workload.hf import check_hf_model

        check_hf_model(spec.model, reads_text=spec.data.kind == "text")
    check_gpu_only_strategies(spec)
    check_engine_packages(spec)
    for strategy in spec.strategy:  # each rank binds itself to its cores: a count the host lacks is named now
        cores_for_rank(0, spec.nproc, strategy.cpu_cores_per_rank)
    shape = shape_of_spec(spec)
    nvme = [s for s in spec.strategy if s.uses_nvme]
    if nvme:
        check_directory(spec.nvme_path, "nvme_path")
        check_direct_io(spec.nvme_path, "nvme_path")
        from offloadlab.engines.ops import check_libaio

        check_libaio()
    for strategy in nvme:
        check_buffer_fits_largest_param(strategy, shape.largest_param_numel)
        check_buffers_hold_the_turn(spec, strategy, shape)
        check_swap_buffers_lockable(spec, strategy, shape)
    check_disk_for_run(spec, run_dir, shape.n_params)
    return shape


def held_to_budget(spec: RunSpec, machine: Machine, console: Console) -> Machine:
    """The machine as the spec's GPU memory budget leaves it, said before the run starts."""
    budget = spec.gpu_memory_limit_gib
    if budget is None:
        return machine
    if machine.gpu_mem_bytes is None:
        console.print(f"  gpu_memory_limit_gib = {budget:g} is not enforced: this machine has no CUDA GPU")
        return machine
    if not holds_a_gpu_of(budget, machine.gpu_mem_bytes):
        console.print(
            f"  gpu_memory_limit_gib = {budget:g} is not below this GPU's {machine.gpu_mem_bytes / GiB:.1f} GiB: "
            "the whole GPU is used"
        )
        return machine
    console.print(f"  every rank is held to {budget:g} GiB of its GPU's {machine.gpu_mem_bytes / GiB:.1f}")
    return replace(machine, gpu_mem_bytes=budget * GiB)


def check_fits(spec: RunSpec, shape: Shape, console: Console, force: bool) -> None:
    """Ask the planner before any process starts: refuse a spec none of whose strategies fits this machine,
    and say which ones are predicted not to fit."""
    from offloadlab.engines.deepspeed.buffers import swap_buffers_of
    from offloadlab.plan.accounting import Placement
    from offloadlab.plan.inputs import detect_machine
    from offloadlab.plan.predict import predict

    machine = held_to_budget(spec, detect_machine(spec.nproc, None, None, spec.nvme_path), console)
    unfit = {}
    for s in spec.strategy:
        prediction = predict(
            Placement(s, spec.model.activation_checkpointing), shape, machine, None, swap_buffers_of(s, shape)
        )
        if not prediction.fits:
            unfit[s.name] = prediction.binding
    if len(unfit) == len(spec.strategy) and not force:
        needs = "; ".join(f"{name} needs {binding}" for name, binding in unfit.items())
        raise PreflightError(
            f"the plan says no strategy of this spec fits this machine ({needs}). "
            "'offloadlab plan SPEC' shows what does; --force runs it anyway"
        )
    for name, binding in unfit.items():
        console.print(f"  {name}: the plan predicts it does not fit ({escape(binding)}); running it to see")
