"""The GPU memory budget (issue 21): its arithmetic, how a run past it is read, and the spec and CLI paths.

A budget cannot be enforced on this CPU-only machine (torch caps only the CUDA allocator): the GPU bench
shows the enforcement (bench/results/2026-12-04-h200-s12).
"""

from __future__ import annotations

import json
import tarfile
import tomllib
from pathlib import Path

import pytest
import torch
from rich.console import Console

from conftest import cli, write_spec
from offloadlab.engines.base import Engine
from offloadlab.plan.accounting import GiB, Machine
from offloadlab.results.status import Status
from offloadlab.results.store import RunStore
from offloadlab.results.summary import summarize
from offloadlab.run.preflight import held_to_budget
from offloadlab.spec import SpecError, load_spec
from offloadlab.train.gpu_budget import (
    GpuBudget,
    GpuBudgetError,
    allocator_cap_bytes,
    allocator_fraction,
    holds_a_gpu_of,
)
from offloadlab.train.worker import classify_failure

REPO = Path(__file__).resolve().parents[1]
# One H200 held to 24 GiB: ZeRO-3 and FSDP2 + DeepSpeed Adam with the optimizer on the CPU trained, FSDP2
# without offload ran out of the budget; and FSDP2 alone held to 48 GiB, where it trained.
BUDGET_RUNS = REPO / "bench/results/2026-12-04-h200-s12/budget_stores.tar.gz"
H200_BYTES = 150_754_820_096  # torch's total_memory of an H200
CONTEXT_BYTES = 600 << 20  # about what the CUDA context and NCCL held there


def test_the_allocator_is_capped_at_the_budget_less_what_lives_outside_it():
    assert allocator_cap_bytes(24 * GiB, CONTEXT_BYTES) == 24 * GiB - CONTEXT_BYTES
    fraction = allocator_fraction(24 * GiB, CONTEXT_BYTES, H200_BYTES)
    assert fraction * H200_BYTES == pytest.approx(24 * GiB - CONTEXT_BYTES)
    # More context means less for the allocator: the GPU as a whole stays within the budget.
    assert allocator_fraction(24 * GiB, 2 * CONTEXT_BYTES, H200_BYTES) < fraction
    assert allocator_fraction(200 * GiB, CONTEXT_BYTES, H200_BYTES) == 1.0


def test_a_budget_below_the_gpus_fixed_costs_is_refused_with_the_fix():
    with pytest.raises(GpuBudgetError, match=r"0\.50 GiB is smaller .* raise gpu_memory_limit_gib"):
        allocator_cap_bytes(512 << 20, CONTEXT_BYTES)


def test_nothing_is_held_without_a_budget_or_on_the_cpu():
    assert GpuBudget.for_rank(None, torch.device("cpu")) is None
    assert GpuBudget.for_rank(24, torch.device("cpu")) is None
    # The rule the worker applies and the fit check plans with: a budget below a GPU's size holds it.
    assert holds_a_gpu_of(24, H200_BYTES) and not holds_a_gpu_of(24, None) and not holds_a_gpu_of(None, H200_BYTES)
    assert not holds_a_gpu_of(80, 80 * GiB) and holds_a_gpu_of(79.9, 80 * GiB)


def test_going_past_the_budget_is_a_does_not_fit_that_names_the_budget():
    budget = GpuBudget(24 * GiB, torch.device("cuda", 0))
    oom = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
        "110.20 GiB is free. Of the allocated memory 22.1 GiB is allocated by PyTorch, and 23.40 GiB allowed"
    )
    status, reason = classify_failure(oom, Engine, budget)
    assert status is Status.DOES_NOT_FIT
    said = "GPU memory budget of 24 GiB exhausted: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert reason == said  # not the rest of torch's message about the whole GPU
    assert classify_failure(oom, Engine)[1].startswith("GPU memory exhausted")  # the whole GPU, no budget
    status, reason = classify_failure(GpuBudgetError("a GPU memory budget of 0.50 GiB is smaller"), Engine, budget)
    assert status is Status.DOES_NOT_FIT and "0.50 GiB" in reason


@pytest.mark.parametrize(
    "gpu_bytes, budget, expected_bytes, said",
    [
        (None, 24, None, "is not enforced: this machine has no CUDA GPU"),
        (80 * GiB, 96, 80 * GiB, "is not below this GPU's 80.0 GiB: the whole GPU is used"),
        (80 * GiB, 80, 80 * GiB, "is not below this GPU's 80.0 GiB: the whole GPU is used"),
        (H200_BYTES, 24, 24 * GiB, "every rank is held to 24 GiB of its GPU's 140.4"),
    ],
)
def test_the_fit_check_plans_against_the_budget_and_says_so(tmp_path, gpu_bytes, budget, expected_bytes, said):
    spec = load_spec(write_spec(tmp_path, [dict(name="f", engine="fsdp2")], gpu_memory_limit_gib=budget))
    console = Console(record=True, width=120)
    machine = held_to_budget(spec, Machine(1, gpu_bytes, 64 * GiB, None), console)
    assert machine.gpu_mem_bytes == expected_bytes
    assert said in console.export_text()


def test_the_spec_refuses_a_budget_of_nothing(tmp_path):
    with pytest.raises(SpecError, match="gpu_memory_limit_gib: Input should be greater than 0"):
        load_spec(write_spec(tmp_path, [dict(name="f", engine="fsdp2")], gpu_memory_limit_gib=0))


@pytest.mark.slow
def test_run_gpu_mem_is_recorded_in_the_store_and_plan_writes_the_budget_it_planned_for(tmp_path):
    spec = write_spec(tmp_path, [dict(name="f", engine="fsdp2")], steps=2, verify_checkpoint=False, telemetry_hz=0)
    run = cli("run", str(spec), "--gpu-mem", "24", "--out", str(tmp_path / "run"))
    assert "gpu_memory_limit_gib = 24 is not enforced: this machine has no CUDA GPU" in run.stdout
    assert tomllib.loads((tmp_path / "run" / "spec.toml").read_text())["gpu_memory_limit_gib"] == 24
    # The planned spec carries the GPU size it was planned for, so its run is held to it.
    out = tmp_path / "planned"
    cli(
        "plan",
        "--model",
        "tiny",
        "--gpu-mem",
        "24",
        "--host-mem",
        "64",
        "--strategy",
        "zero2-cpu",
        "--write",
        str(out),
    )
    assert load_spec(out / "zero2-cpu.toml").gpu_memory_limit_gib == 24
    assert cli("run", str(spec), "--gpu-mem", "0", "--out", str(tmp_path / "r0"), check=False).returncode == 2


def test_an_h200_run_held_to_24_gib_records_the_budget_and_what_did_not_fit_in_it(tmp_path):
    with tarfile.open(BUDGET_RUNS) as tar:
        tar.extractall(tmp_path, filter="data")
    summaries = {s.name: s for s in summarize(RunStore(tmp_path / "b24"))}
    assert summaries["fsdp2"].status is Status.DOES_NOT_FIT
    assert summaries["fsdp2"].reason.startswith("GPU memory budget of 24 GiB exhausted: OutOfMemoryError")
    for name in ("zero3-opt-cpu", "fsdp2-cpu-dsadam"):
        trained = summaries[name]
        assert trained.status is Status.DONE
        assert trained.gpu_budget_bytes == trained.gpu_memory_bytes == 24 * GiB  # peaks are held to the budget
        assert trained.peak_reserved_bytes < 24 * GiB
    (alone,) = summarize(RunStore(tmp_path / "b48"))
    assert alone.status is Status.DONE and alone.gpu_memory_bytes == 48 * GiB < alone.peak_reserved_bytes * 2
    compare = cli("compare", str(tmp_path / "b24"))
    assert "GPU memory budget 24.0 GiB a rank: GPU shares are of it" in compare.stdout
    assert "does not fit (0/14)" in compare.stdout


@pytest.mark.slow
def test_plan_plans_for_the_specs_budget_unless_told_there_is_no_gpu(tmp_path):
    spec = write_spec(tmp_path, [dict(name="f", engine="fsdp2")], gpu_memory_limit_gib=24)
    planned = json.loads(cli("plan", str(spec), "--host-mem", "64", "--json").stdout)
    assert planned["machine"]["gpu_mem_bytes"] == 24 * GiB
    # --gpu-mem 0 means no GPU: the spec's budget must not bring one back.
    planned = json.loads(cli("plan", str(spec), "--gpu-mem", "0", "--host-mem", "64", "--json").stdout)
    assert planned["machine"]["gpu_mem_bytes"] is None
