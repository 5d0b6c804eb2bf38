"""`offloadlab run`: each strategy in its own torchrun job, so a crash or OOM in one is that strategy's result.

The parent owns the run directory and the per-strategy NVMe folders it creates under the spec's nvme_path;
it removes those folders, checkpoints and scratch space when a strategy ends, fails or is interrupted, and
never deletes anything it did not create.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import tomli_w
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from offloadlab.ops import announce_on, ensure_built
from offloadlab.preflight import preflight_run
from offloadlab.spec import FSDP2Strategy, RunSpec, SpecError
from offloadlab.store import RunStore

NVME_PREFIX = "offloadlab-"

# torch's pinned-memory allocator rounds each allocation up to a power of two. DeepSpeed pins its swap
# buffers, gradient partitions and max_in_cpu parameters as a few multi-GB tensors, so the rounding locks
# up to twice their size in RAM (48 parameter buffers of 206 MB, 9.2 GiB, take 16). Above 64 MiB the
# allocator then takes what is asked; a user's own allocator settings are left as they are.
PINNED_EXACT_ABOVE = "pinned_max_round_threshold_mb:64"


def worker_env(environ) -> dict[str, str]:
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    # torch 2.11 rejects the key (every worker fails to start); 2.13 has it.
    torch_version = tuple(int(x) for x in version("torch").split(".")[:2])
    if torch_version >= (2, 13) and "PYTORCH_ALLOC_CONF" not in env and "PYTORCH_CUDA_ALLOC_CONF" not in env:
        env["PYTORCH_ALLOC_CONF"] = PINNED_EXACT_ABOVE
    return env


@dataclass(frozen=True)
class Launch:
    """How torchrun starts each strategy; several hosts use torchrun's own rendezvous."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500

    def torchrun_args(self, nproc: int) -> list[str]:
        if self.nnodes == 1 and self.master_addr is None:
            return ["--standalone", f"--nproc-per-node={nproc}"]
        return [
            f"--nnodes={self.nnodes}",
            f"--node-rank={self.node_rank}",
            f"--nproc-per-node={nproc}",
            f"--master-addr={self.master_addr or '127.0.0.1'}",
            f"--master-port={self.master_port}",
        ]


def spec_toml(spec: RunSpec) -> str:
    """The spec as resolved (absolute paths, defaults filled in): what the workers and the store read."""
    return tomli_w.dumps(spec.model_dump(mode="json", exclude_none=True))


def new_run_dir(spec: RunSpec, out: Path | None) -> Path:
    """The run directory's path, checked to be new or empty; created by the caller after the preflight."""
    run_dir = out or Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise SpecError(f"run directory {run_dir} exists and is not empty: pass another --out")
    return run_dir.resolve()


@dataclass
class StrategyJob:
    name: str
    strategy_id: int
    nvme_dir: Path | None
    log: Path
    proc: subprocess.Popen | None = None
    created: list[Path] = field(default_factory=list)


class Runner:
    def __init__(self, spec: RunSpec, run_dir: Path, launch: Launch, console: Console, keep_checkpoints: bool = False):
        self.spec, self.run_dir, self.launch, self.console = spec, run_dir, launch, console
        self.keep_checkpoints = keep_checkpoints
        self.store = RunStore(run_dir, create_schema=True)
        self.run_id = self.store.add_run(spec.name, spec_toml(spec))
        (run_dir / "spec.toml").write_text(spec_toml(spec))
        (run_dir / "logs").mkdir(exist_ok=True)
        self.jobs = [self._job(s) for s in spec.strategy]

    def _job(self, strategy) -> StrategyJob:
        config = strategy.model_dump(mode="json")
        strategy_id = self.store.add_strategy(self.run_id, strategy.name, strategy.engine, config, self.spec.steps)
        nvme_dir = self.spec.nvme_path / f"{NVME_PREFIX}{self.run_dir.name}-{strategy.name}" if strategy.uses_nvme else None
        return StrategyJob(strategy.name, strategy_id, nvme_dir, self.run_dir / "logs" / f"{strategy.name}.log")

    def run(self) -> None:
        try:
            with Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), console=self.console,
            ) as progress:
                for job in self.jobs:
                    self._run_strategy(job, progress)
            self.store.set_run_status(self.run_id, "done")
        except KeyboardInterrupt:
            self.store.set_run_status(self.run_id, "interrupted")
            for job in self.jobs:
                self._stop(job)
                if self.store.strategy(job.strategy_id)["status"] in ("pending", "running"):
                    self.store.set_strategy_status(job.strategy_id, "failed", "interrupted by the user")
                self._clean(job)
            raise

    def _run_strategy(self, job: StrategyJob, progress: Progress) -> None:
        task = progress.add_task(f"{job.name:<18}", total=self.spec.steps)
        self.store.set_strategy_status(job.strategy_id, "running")
        if job.nvme_dir is not None:
            job.nvme_dir.mkdir()
            job.created.append(job.nvme_dir)
        try:
            rc = self._launch(job, "train", progress, task)
            if rc != 0 and self.store.strategy(job.strategy_id)["status"] == "running":
                self.store.set_strategy_status(job.strategy_id, *self._exit_reason(rc, job.log))
            elif rc == 0:
                if self.spec.verify_checkpoint:
                    progress.update(task, description=f"{job.name:<18} (verifying checkpoint)")
                    rc = self._launch(job, "verify", progress, None)
                    if rc != 0 and self.store.strategy(job.strategy_id)["checkpoint_verified"] is None:
                        self.store.set_checkpoint_result(job.strategy_id, False, self._exit_reason(rc, job.log)[1])
                    elif rc == 0 and self._restores_at_world_1(job):
                        progress.update(task, description=f"{job.name:<18} (restoring at world size 1)")
                        at_own_world = self.store.strategy(job.strategy_id)["checkpoint_detail"]
                        rc_world_1 = self._launch(job, "verify", progress, None, nproc=1)
                        if rc_world_1 != 0:
                            self.store.set_checkpoint_result(
                                job.strategy_id, False, f"{at_own_world} | restore at world size 1 failed: "
                                f"{self._exit_reason(rc_world_1, job.log)[1]}")
                self.store.set_strategy_status(job.strategy_id, "done")
        finally:
            self._clean(job)
        row = self.store.strategy(job.strategy_id)
        label = {"done": "[green]done[/]", "does_not_fit": "[yellow]does not fit[/]"}.get(row["status"], "[red]failed[/]")
        progress.update(task, description=f"{job.name:<18} {label}")
        if row["reason"]:
            self.console.print(f"  {job.name}: {row['status'].replace('_', ' ')}: {row['reason']} (log: {job.log})")

    def _restores_at_world_1(self, job: StrategyJob) -> bool:
        """FSDP2's DCP checkpoints reshard on load; DeepSpeed's need its universal-checkpoint conversion
        first, which offloadlab does not run. One host only: the check runs where rank 0 saved."""
        strategy = self.spec.get_strategy(job.name)
        return self.spec.nproc > 1 and self.launch.nnodes == 1 and isinstance(strategy, FSDP2Strategy)

    def _launch(self, job: StrategyJob, mode: str, progress: Progress, task, nproc: int | None = None) -> int:
        launch = self.launch if nproc is None else Launch()
        cmd = [sys.executable, "-m", "torch.distributed.run", *launch.torchrun_args(nproc or self.spec.nproc),
               "-m", "offloadlab.worker", "--run-dir", str(self.run_dir), "--strategy", job.name, "--mode", mode]
        if job.nvme_dir is not None:
            cmd += ["--nvme-dir", str(job.nvme_dir)]
        env = worker_env(os.environ)
        with open(job.log, "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            # A session of its own, so Ctrl-C reaches the parent first and the parent stops the job whole.
            job.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            while job.proc.poll() is None:
                if task is not None:
                    progress.update(task, completed=self._steps_done(job))
                time.sleep(0.3)
        if task is not None:
            progress.update(task, completed=self._steps_done(job))
        rc, job.proc = job.proc.returncode, None
        return rc

    def _steps_done(self, job: StrategyJob) -> int:
        row = self.store.conn.execute(
            "SELECT MAX(step) FROM steps WHERE strategy_id = ? AND rank = 0 AND phase = 'train'", (job.strategy_id,)
        ).fetchone()
        return row[0] or 0

    @staticmethod
    def _exit_reason(rc: int, log: Path) -> tuple[str, str]:
        """Why a job ended without recording a result itself (it was killed, or crashed before the store)."""
        text = log.read_text(errors="replace") if log.exists() else ""
        latest = text[text.rfind("\n$ ") + 1:]  # this launch's output only; the log holds train and verify
        # torchrun exits 1 when a rank dies; it names the signal in its summary.
        if rc in (-signal.SIGKILL, 128 + signal.SIGKILL) or "SIGKILL" in latest or "exitcode  : -9" in latest:
            return "does_not_fit", "killed by SIGKILL, most likely by the kernel's OOM killer (host RAM)"
        lines = [line for line in latest.splitlines() if line.strip() and not line.startswith("$ ")]
        return "failed", f"exited with code {rc}: {lines[-1][:300] if lines else 'no output'}"

    def _stop(self, job: StrategyJob) -> None:
        if job.proc is None or job.proc.poll() is not None:
            return
        os.killpg(job.proc.pid, signal.SIGTERM)
        try:
            job.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()

    def _clean(self, job: StrategyJob) -> None:
        for path in job.created:
            shutil.rmtree(path, ignore_errors=True)
        job.created.clear()
        shutil.rmtree(self.run_dir / "scratch" / job.name, ignore_errors=True)
        if not self.keep_checkpoints:
            shutil.rmtree(self.run_dir / "checkpoints" / job.name, ignore_errors=True)


def run_spec(spec: RunSpec, out: Path | None, launch: Launch, console: Console, keep_checkpoints: bool = False) -> Path:
    run_dir = new_run_dir(spec, out)
    preflight_run(spec, run_dir)
    # Built here, once, with the wait explained, rather than by the first rank that needs it inside a job.
    ensure_built((op for s in spec.strategy for op in s.ops_needed), announce_on(console))
    run_dir.mkdir(parents=True, exist_ok=True)
    Runner(spec, run_dir, launch, console, keep_checkpoints).run()
    return run_dir
