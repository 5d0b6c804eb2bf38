"""What `offloadlab run` checks of a spec before it starts a process: the NVMe folder, swap buffers against
the largest parameter, the parameters DeepSpeed holds at once and the page-locking limit, and disk for every
strategy's swap and checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

from offloadlab.checks.host import (
    PreflightError,
    check_direct_io,
    check_directory,
    check_free_disk,
    check_memlock,
    check_writable,
    nearest_existing,
)
from offloadlab.engines import engine_class
from offloadlab.plan.accounting import Placement, Shape, shape_of_spec
from offloadlab.plan.deepspeed import params_held_at_turn, swap_buffers, swap_buffers_of, swapped_numels
from offloadlab.spec import DeepSpeedStrategy, RunSpec


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
    sizes = swap_buffers(placement, shape, spec.nproc, swap_buffers_of(strategy, shape)).values()
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
        engine = engine_class(strategy)
        swap = 1.1 * engine.swap_bytes(strategy, n_params, param_bytes)
        checkpoint = engine.checkpoint_bytes(strategy, n_params, param_bytes) if spec.verify_checkpoint else 0
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


def preflight_run(spec: RunSpec, run_dir: Path) -> Shape:
    """Everything `offloadlab run` can check before it starts a process; run_dir need not exist yet.
    Returns the model's shape, which the fit check reads too (built once: an HF config is read for it)."""
    check_writable(run_dir, "run folder (--out)")
    if spec.model.is_hf:
        from offloadlab.workload.hf import check_hf_folder

        check_hf_folder(spec.model.hf_path, with_weights=spec.model.hf_model is not None)
        if spec.data.kind == "text":
            from offloadlab.workload.data import load_tokenizer
            from offloadlab.workload.hf import hf_folder

            load_tokenizer(hf_folder(spec.model.hf_path))
    check_gpu_only_strategies(spec)
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
