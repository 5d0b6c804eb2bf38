"""Preflight: bad paths and sizes fail before any work, with the fix named, and leave nothing behind."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli, flat, write_spec
from offloadlab.checks.host import (
    CAP_IPC_LOCK,
    PreflightError,
    check_direct_io,
    check_directory,
    check_free_disk,
    has_cap_ipc_lock,
)
from offloadlab.run.preflight import check_disk_for_run
from offloadlab.spec import load_spec

NVME_STRATEGY = dict(
    name="z3", engine="deepspeed", zero_stage=3, offload_optimizer="nvme", offload_param="nvme", buffer_size=1_000_000
)


def test_missing_path():
    with pytest.raises(PreflightError, match="does not exist: create it"):
        check_directory(Path("/nonexistent/offloadlab"), "nvme_path")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to any folder, so a read-only one cannot be made here")
def test_read_only_path(tmp_path):
    tmp_path.chmod(0o555)
    with pytest.raises(PreflightError, match="not writable"):
        check_directory(tmp_path, "nvme_path")


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm tmpfs on this machine")
def test_tmpfs_has_no_o_direct():
    with pytest.raises(PreflightError, match="tmpfs, which is RAM and has no O_DIRECT"):
        check_direct_io(Path("/dev/shm"), "nvme_path")


def test_direct_io_probe_works_on_disk_and_leaves_nothing(tmp_path):
    check_direct_io(tmp_path, "nvme_path")
    assert list(tmp_path.iterdir()) == []


def test_too_little_free_disk(tmp_path):
    with pytest.raises(PreflightError, match=r"GiB free, .* GiB needed"):
        check_free_disk(tmp_path, 10**18, "nvme_path")


@pytest.mark.slow
def test_run_rejects_a_swap_buffer_smaller_than_the_largest_parameter(tmp_path):
    spec = write_spec(tmp_path, [NVME_STRATEGY | {"buffer_size": 1000}], nvme_path=str(tmp_path))
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    # tiny: the largest parameter is the 256 x 64 embedding (and head).
    assert "buffer_size = 1,000 elements is smaller than the largest parameter (16,384 elements" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]


# small-cpu's parameters all on the drive (max_in_cpu = 0; under DeepSpeed's default 1e9 a model this small
# stays in RAM and never swaps them), with a reuse window that keeps only the last few at the turn.
SWAPPED_PARAMS = dict(
    name="z3", engine="deepspeed", zero_stage=3, offload_optimizer="cpu", offload_param="nvme",
    buffer_size=2_000_000, max_in_cpu=0, stage3_max_reuse_distance=3_000_000,
)  # fmt: skip
WITHOUT_THE_CHECK = (
    "import sys; import offloadlab.run.preflight as p; p.check_buffers_hold_the_turn = lambda *a: None; "
    "from offloadlab.cli import main; sys.argv[0] = 'offloadlab'; main()"
)


@pytest.mark.slow
def test_too_few_parameter_swap_buffers_are_refused_before_deepspeed_would_stop_at_the_second_pass(tmp_path):
    """On an H200 the 1.42B GPT with 16 parameter swap buffers and DeepSpeed's 1e9 reuse window trained
    step 1 (27 s) and stopped at step 2 with 'Not enough buffers 0 for swapping 1'. The check's count is
    DeepSpeed's own boundary: one buffer fewer stops at the second micro-batch (the first traces the
    model), as many trains."""
    from offloadlab.engines.deepspeed.buffers import params_held_at_turn, swapped_numels
    from offloadlab.plan.accounting import shape_of_spec

    def spec_with(buffers: int) -> Path:
        folder = tmp_path / f"buffers-{buffers}"
        folder.mkdir(exist_ok=True)
        overrides = dict(steps=3, seq_len=64, model=dict(preset="small-cpu"), nvme_path=str(tmp_path))
        overrides.update(verify_checkpoint=False)
        return write_spec(folder, [SWAPPED_PARAMS | {"buffer_count": buffers}], **overrides)

    spec = load_spec(spec_with(1))
    swapped = swapped_numels(shape_of_spec(spec), spec.strategy[0], 1, spec.strategy[0].aio)
    needed = params_held_at_turn(swapped, spec.strategy[0])
    assert 1 < needed < len(swapped)  # the window keeps some parameters, not all

    refused = cli("run", str(spec_with(needed - 1)), "--out", str(tmp_path / "refused"), check=False)
    assert refused.returncode == 2
    assert f"buffer_count = {needed - 1} is too few" in flat(refused.stderr)
    assert f"Set buffer_count >= {needed}" in flat(refused.stderr)
    assert not (tmp_path / "refused").exists()

    for buffers, (status, steps) in ((needed - 1, ("does_not_fit", 0)), (needed, ("done", 3))):
        out = tmp_path / f"run-{buffers}"
        env = {**os.environ, "DS_ACCELERATOR": "cpu"}
        subprocess.run(
            [sys.executable, "-c", WITHOUT_THE_CHECK, "run", str(spec_with(buffers)), "--out", str(out)],
            env=env, capture_output=True, timeout=600,
        )  # fmt: skip
        (shown,) = json.loads(cli("compare", str(out), "--json").stdout)
        assert (shown["status"], shown["steps_done"]) == (status, steps), shown
        assert ("Not enough buffers 0 for swapping 1" in (shown["reason"] or "")) == (buffers < needed)


@pytest.mark.slow
def test_run_rejects_tmpfs_nvme_path(tmp_path):
    spec = write_spec(tmp_path, [NVME_STRATEGY], nvme_path="/dev/shm")
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    assert "no O_DIRECT" in proc.stderr


def _held_to(limit: int) -> list[str] | None:
    """A command prefix that runs as Docker's root does: `ulimit -l` held to `limit` bytes, no CAP_IPC_LOCK;
    None where this machine cannot do that (no prlimit or setpriv, or not allowed to drop the capability)."""
    prefix = ["prlimit", f"--memlock={limit}:{limit}"]
    if has_cap_ipc_lock():
        prefix += ["setpriv", "--bounding-set=-ipc_lock", "--"]
    if not all(shutil.which(tool) for tool in ("prlimit", "setpriv")):
        return None
    probe = subprocess.run([*prefix, "cat", "/proc/self/status"], capture_output=True, text=True)
    caps = next((line for line in probe.stdout.splitlines() if line.startswith("CapEff:")), None)
    if probe.returncode != 0 or caps is None or int(caps.split()[1], 16) >> CAP_IPC_LOCK & 1:
        return None
    return prefix


@pytest.mark.slow
def test_run_refuses_swap_buffers_over_ulimit_l_before_anything_starts(tmp_path):
    """DeepSpeed mlocks its NVMe swap buffers: over `ulimit -l` (8 MiB in many containers) each rank aborted
    at start with "mlock failed", and the run said "exited with code 1: =====". Here 5 x 1M fp32 parameter
    buffers (20 MB) against an 8 MiB limit are refused before any process starts."""
    _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    prefix = _held_to(8 << 20 if hard == resource.RLIM_INFINITY else min(8 << 20, hard))
    if prefix is None:
        pytest.skip("cannot hold a process to a memlock limit without CAP_IPC_LOCK here")
    spec = write_spec(tmp_path, [NVME_STRATEGY], nvme_path=str(tmp_path))
    offloadlab = str(Path(sys.executable).parent / "offloadlab")
    run = [*prefix, offloadlab, "run", str(spec), "--out", str(tmp_path / "run")]
    proc = subprocess.run(run, capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    message = flat(proc.stdout + proc.stderr)
    assert proc.returncode == 2, message
    assert "strategy z3's NVMe swap buffers: ulimit -l is" in message
    assert "docker run --ulimit memlock=-1" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]


def _model_of(n_params_target: int) -> dict:
    """One block of d = 1024 and a vocabulary sized so the model has about n_params_target parameters."""
    d = 1024
    return dict(d_model=d, n_layers=1, n_heads=8, vocab_size=max(256, (n_params_target - 12 * d * d) // (2 * d)))


@pytest.mark.slow
def test_run_counts_the_checkpoint_beside_the_swap_folder_on_one_drive(tmp_path):
    """A ZeRO-3 NVMe strategy whose swap folder fits the free disk, but not with its checkpoint and the
    restore check's second copy on the same drive: refused before any process starts, with the fixes named."""
    from offloadlab.spec import ModelSpec
    from offloadlab.workload.model import gpt_config

    free = shutil.disk_usage(tmp_path).free
    model = _model_of(int(free / 30))  # swap ~19.8 B/param fits; swap + 2 x 12 B/param checkpoint does not
    n_params = gpt_config(ModelSpec(**model), 32).n_params
    assert 1.1 * 18 * n_params < free < (1.1 * 18 + 24) * n_params
    strategy = NVME_STRATEGY | {"buffer_size": 2 * n_params}
    spec = write_spec(tmp_path, [strategy], nvme_path=str(tmp_path), precision="bf16", model=model)
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "'z3': nvme_path (swap + checkpoint)" in proc.stderr
    assert "set verify_checkpoint = false, or pass --out on another drive" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]

    without_check = load_spec(
        write_spec(
            tmp_path, [strategy], nvme_path=str(tmp_path), precision="bf16", model=model, verify_checkpoint=False
        )
    )
    check_disk_for_run(without_check, tmp_path / "run", n_params)  # the swap folder alone fits


@pytest.mark.slow
def test_run_refuses_a_plan_that_is_not_of_its_spec_before_any_work(tmp_path):
    """`run --plan` takes `offloadlab plan SPEC --json` output; another file, another model's plan, or one
    without the spec's strategies is refused, naming the command that makes the right one."""
    spec = write_spec(tmp_path, [NVME_STRATEGY], nvme_path=str(tmp_path))
    (tmp_path / "other").mkdir()
    other = write_spec(tmp_path / "other", [NVME_STRATEGY], nvme_path=str(tmp_path), seq_len=64)
    (tmp_path / "other.json").write_text(cli("plan", str(other), "--json").stdout)
    (tmp_path / "table.txt").write_text("a table, not JSON")
    for given, said in (
        ("table.txt", "is not the JSON of 'offloadlab plan --json'"),
        ("other.json", "is of another model or batch (seq_len 64 in the plan, 32 here)"),
    ):
        proc = cli("run", str(spec), "--out", str(tmp_path / "run"), "--plan", str(tmp_path / given), check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert said in flat(proc.stderr) and "write it with 'offloadlab plan SPEC --json >" in flat(proc.stderr)
    assert not (tmp_path / "run").exists()
