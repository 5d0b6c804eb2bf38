"""Entry point of one strategy's process (one per rank, started by `offloadlab run`: itself for one rank,
through torchrun for several).

    python -m offloadlab.train.worker --run-dir D --strategy NAME --mode train|verify [--nvme-dir P]

train: train every step, save after the spec's save step. verify: in a fresh process, restore that
checkpoint, compare the full state with what was saved, train the next step and compare its loss with the
uninterrupted run's. A failure is classified (does not fit / failed) and written to the run store before
the process exits non-zero, so the parent and the other strategies go on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import tomllib
import traceback
from dataclasses import asdict
from functools import partial
from pathlib import Path

import psutil
import torch

from offloadlab.engines import engine_for
from offloadlab.engines.base import Engine, build_engine
from offloadlab.engines.dist import DistContext, end_rank
from offloadlab.results.figures import (
    LAUNCH_EVENT,
    LAUNCH_TOKEN_ENV,
    MODEL_FACTS_EVENT,
    RANK_PROCESS_EVENT,
    ModelFacts,
    RankProcess,
)
from offloadlab.results.rundir import RunDir, is_disk_full
from offloadlab.results.status import Status
from offloadlab.results.store import RunStore, StoreError
from offloadlab.spec import RunSpec, SpecError, parse_spec
from offloadlab.telemetry.probes import device_memory_total, device_name
from offloadlab.telemetry.sampler import SamplerProcess
from offloadlab.train.checkpoint import restore_and_check
from offloadlab.train.comm_meter import CommMeter
from offloadlab.train.cores import cores_for_rank, pin_this_rank
from offloadlab.train.gpu_budget import GiB, GpuBudget, GpuBudgetError
from offloadlab.train.swap_meter import SwapMeter
from offloadlab.train.trainer import StepWindow, run_steps
from offloadlab.workload.data import TokenSource
from offloadlab.workload.model import model_numbers

# Two losses of the same step agree to this relative tolerance after a restore (float reductions may be
# reordered by a rebuilt engine; a wrong restore moves the loss by far more). At another world size the
# same samples are summed in another grouping (ranks vs micro-batches): 1e-4, as two ranks vs one agree.
LOSS_RTOL = 1e-5
LOSS_RTOL_OTHER_WORLD = 1e-4


def classify_failure(exc: BaseException, engine: type[Engine], budget: GpuBudget | None = None) -> tuple[Status, str]:
    """(status, reason) for the run store: does not fit when memory, swap buffers or disk ran out."""
    own = engine.failure_reason(exc)
    if own is not None:
        return own
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]
    # torch's OOM goes on for 600 characters about the whole GPU and its allocator: 22 lines of compare's
    # status column. What failed is the allocation.
    text = re.sub(r"(Tried to allocate [\d.]+ \w+\.).*", r"\1", text)
    if isinstance(exc, GpuBudgetError):
        return Status.DOES_NOT_FIT, str(exc)
    if budget is not None and "out of memory" in str(exc).lower():
        return Status.DOES_NOT_FIT, f"GPU memory budget of {budget.budget_bytes / GiB:g} GiB exhausted: {text}"
    if isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "DefaultCPUAllocator" in str(exc):
        return Status.DOES_NOT_FIT, f"host RAM exhausted: {text}"
    if "out of memory" in str(exc).lower():  # torch.OutOfMemoryError, and CUDA's own message
        return Status.DOES_NOT_FIT, f"GPU memory exhausted: {text}"
    if is_disk_full(exc):
        return Status.DOES_NOT_FIT, f"disk full: {text}"
    return Status.FAILED, text


def sampler_for(spec: RunSpec, ctx: DistContext, run_dir: Path, strategy_id: int, nvme_dir: Path | None):
    """One sampler per host (local rank 0), covering every GPU and, through torchrun's agent, every rank."""
    if spec.telemetry_hz == 0 or ctx.local_rank != 0:
        return contextlib.nullcontext()
    root_pid = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else os.getpid()
    disk_path = nvme_dir or spec.nvme_path or run_dir
    return SamplerProcess(run_dir, strategy_id, hz=spec.telemetry_hz, nvme_path=disk_path, root_pid=root_pid)


def build_within(budget: GpuBudget | None, spec: RunSpec, strategy, ctx, nvme_dir: Path | None) -> Engine:
    """The engine, built under the GPU memory budget where there is one to hold."""
    if budget:
        budget.apply()  # before the engine allocates anything
    engine = build_engine(spec, strategy, ctx, nvme_dir)
    if budget:
        budget.apply()  # NCCL's communicators and the engine's libraries now hold memory outside the allocator
    return engine


def record_model_facts(store: RunStore, strategy_id: int, spec: RunSpec, engine, budget: GpuBudget | None) -> None:
    n_params, n_layers, d_model = model_numbers(engine.module)
    facts = ModelFacts(
        n_params,
        n_layers,
        d_model,
        spec.seq_len,
        spec.precision,
        device_name(engine.ctx.device),
        engine.ctx.world_size,
        engine.pinned_swap_bytes(),
        device_memory_total(engine.ctx.device),
        psutil.virtual_memory().total,
        budget.budget_bytes if budget else None,
        tuple(sorted(os.sched_getaffinity(0))),
        torch.get_num_threads(),
        engine.tensors_on_nvme(),
    )
    now = time.time()
    store.add_events(strategy_id, 0, [(None, MODEL_FACTS_EVENT, now, now, json.dumps(asdict(facts)))])


def record_rank_process(store: RunStore, strategy_id: int, ctx, mode: str) -> None:
    cores = tuple(sorted(os.sched_getaffinity(0)))
    rank = RankProcess(os.getpid(), socket.gethostname(), ctx.local_rank, str(ctx.device), cores, mode)
    now = time.time()
    store.add_events(strategy_id, ctx.rank, [(None, RANK_PROCESS_EVENT, now, now, json.dumps(asdict(rank)))])


def _train(spec, strategy, ctx, budget, store, strategy_id, run_dir, nvme_dir) -> None:
    with sampler_for(spec, ctx, run_dir, strategy_id, nvme_dir):
        engine = build_within(budget, spec, strategy, ctx, nvme_dir)
        if ctx.rank == 0:
            record_model_facts(store, strategy_id, spec, engine, budget)
        source = TokenSource.for_run(spec, RunDir.at(run_dir).tokens_cache)
        root = RunDir.at(run_dir).checkpoints(strategy.name) if spec.verify_checkpoint else None
        window = StepWindow(1, spec.steps)
        run_steps(engine, spec, source, store, strategy_id, window, checkpoint_root=root, budget=budget)
        engine.close()


def _verify(spec, strategy, ctx, budget, store, strategy_id, run_dir, nvme_dir) -> None:
    """Restore at the world size torchrun gave; at another one than the run's, the same effective batch."""
    other_world = ctx.world_size != spec.nproc
    if other_world:
        spec = spec.model_copy(
            update={"grad_accum": spec.grad_accum * spec.nproc // ctx.world_size, "nproc": ctx.world_size}
        )
    engine = build_within(budget, spec, strategy, ctx, nvme_dir)
    source = TokenSource.for_run(spec, RunDir.at(run_dir).tokens_cache)
    layout = RunDir.at(run_dir)
    check = restore_and_check(
        engine,
        layout.checkpoints(strategy.name),
        scratch=layout.scratch(strategy.name),
        saved_files=partial(store.checkpoint_files, strategy_id),
    )
    next_step = check.step + 1
    phase = f"restored@world{ctx.world_size}" if other_world else "restored"
    (restored,) = run_steps(engine, spec, source, store, strategy_id, StepWindow(next_step, next_step, phase=phase))
    engine.close()
    if ctx.rank != 0:
        return
    uninterrupted = {r.step: r.loss for r in store.steps(strategy_id)}[next_step]
    rtol = LOSS_RTOL_OTHER_WORLD if other_world else LOSS_RTOL
    loss_ok = abs(restored.loss - uninterrupted) <= rtol * max(1.0, abs(uninterrupted))
    parts = [
        f"step {check.step} restored (saved after {check.saved_step})",
        f"{check.tensors_compared - len(check.mismatched)}/{check.tensors_compared} state entries equal",
        f"step {next_step} loss {restored.loss:.6f} vs uninterrupted {uninterrupted:.6f}",
    ]
    if check.mismatched:
        parts.append("differing: " + ", ".join(check.mismatched[:5]) + (" ..." if len(check.mismatched) > 5 else ""))
    if other_world:  # a second check beside the one at the run's own world size
        row = store.strategy(strategy_id)
        store.set_checkpoint_result(
            strategy_id,
            bool(row["checkpoint_verified"]) and check.ok and loss_ok,
            f"{row['checkpoint_detail']} | restored at world size {ctx.world_size}: " + "; ".join(parts),
        )
        return
    store.set_checkpoint_result(strategy_id, check.ok and loss_ok, "; ".join(parts))


def watch_the_run(run_dir: RunDir, period_s: float = 1.0) -> None:
    """End this rank when `offloadlab run` is gone (SIGKILL, a lost terminal): each job has a session of
    its own, so nothing else would stop its ranks training to the last step. Its sampler follows (its
    stdin closes) and so does torchrun where there is one (its ranks exited); the next `run` beside this
    one marks the run interrupted and removes the swap folder."""

    def watch() -> None:
        while run_dir.is_live():
            time.sleep(period_s)
        os.kill(os.getpid(), signal.SIGKILL)

    if run_dir.is_live():
        threading.Thread(target=watch, name="offloadlab-watch-run", daemon=True).start()


def _not_being_run(store: RunStore, run_dir: RunDir, strategy_id: int, name: str) -> str | None:
    """Why this process must not start: the command in a strategy's log, run again by hand, would record
    a second result over the one its run made (a verify rewrites the checkpoint's verdict), or beside the
    ranks the run is training. Only the launch the run made last holds the token it recorded."""
    status = Status(store.strategy(strategy_id)["status"])
    launches = store.events(strategy_id, LAUNCH_EVENT, rank=0)
    token = os.environ.get(LAUNCH_TOKEN_ENV)
    if run_dir.is_live() and status is Status.RUNNING and launches and launches[-1]["detail"] == token:
        return None
    return (
        f"error: {name} is not being run by this process's `offloadlab run` in {run_dir.root} (the strategy is "
        f"{status.label}): `offloadlab run` starts this process itself. To train and check it again, run the "
        f"spec the run wrote in a new folder: `offloadlab run {run_dir.root / 'spec.toml'} --out NEW_FOLDER`"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offloadlab.train.worker")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--mode", choices=("train", "verify"), required=True)
    parser.add_argument("--nvme-dir", type=Path)
    args = parser.parse_args(argv)
    watch_the_run(RunDir.at(args.run_dir))
    try:
        store = RunStore(args.run_dir, writable=True)
    except StoreError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run = store.run()
    spec = parse_spec(tomllib.loads(run["spec_toml"]), f"{args.run_dir}/spec")
    try:
        strategy = spec.get_strategy(args.strategy)
        strategy_id = store.strategy_id(run["id"], strategy.name)
        refusal = _not_being_run(store, RunDir.at(args.run_dir), strategy_id, strategy.name)
    except (SpecError, LookupError) as err:  # a hand-typed name: the command in a log has the right one
        refusal = f"error: {err}"
    if refusal:
        store.close()
        print(refusal, file=sys.stderr)
        return 2
    ctx = DistContext.from_env()
    cores = cores_for_rank(ctx.local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", 1)), strategy.cpu_cores_per_rank)
    pin_this_rank(cores)
    budget = GpuBudget.for_rank(spec.gpu_memory_limit_gib, ctx.device)
    # Before any engine is built: DeepSpeed binds torch.distributed's functions when it starts, and its
    # swappers make their aio handles.
    CommMeter.install()
    record_rank_process(store, strategy_id, ctx, args.mode)
    if strategy.uses_nvme:
        SwapMeter.install()
    try:
        (_train if args.mode == "train" else _verify)(
            spec, strategy, ctx, budget, store, strategy_id, args.run_dir, args.nvme_dir
        )
    except BaseException as exc:  # noqa: BLE001 - every failure is recorded, then re-raised as an exit code
        status, reason = classify_failure(exc, engine_for(strategy).adapter(), budget)
        if args.mode == "verify":
            store.set_checkpoint_result(strategy_id, False, f"restore failed: {reason}")
        else:
            store.set_strategy_status(strategy_id, status, reason)
        traceback.print_exc()
        return 1
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    end_rank(main())
