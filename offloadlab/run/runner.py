"""`offloadlab run`: each strategy in its own job, so a crash or OOM in one is that strategy's result.

The parent holds the run folder's lock for the run's life and owns what the run creates: each strategy's
NVMe folder under the spec's nvme_path (recorded in the store before it is made), its checkpoints, scratch
and temp folders inside the run folder. It removes them when a strategy ends, fails or is interrupted, also
when a second Ctrl-C comes during that, and never deletes anything it did not create. Jobs start in the
run folder with PYTHONSAFEPATH set, so no module in the user's current folder is ever imported.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tomli_w
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from offloadlab.checks.host import PINNED_EXACT_ABOVE, sets_pinned_exact
from offloadlab.engines import engine_for
from offloadlab.engines.ops import announce_on, ensure_built
from offloadlab.results.figures import (
    LAUNCH_EVENT,
    LAUNCH_TOKEN_ENV,
    MODEL_FACTS_EVENT,
    RANK_PROCESS_EVENT,
    ModelFacts,
)
from offloadlab.results.rundir import RunDir, RunDirError, is_disk_full, signals_ignored
from offloadlab.results.status import Status
from offloadlab.results.store import RunStore, StoreError, is_run_store
from offloadlab.results.summary import Planned, record_plan, store_figures
from offloadlab.results.tables import SWAPPED_NOTHING_WHY, human_bytes
from offloadlab.run.preflight import check_fits, preflight_run
from offloadlab.spec import RunSpec, SpecError
from offloadlab.workload.data import run_tokens


def worker_env(environ, tmp: Path) -> dict[str, str]:
    # PYTHONSAFEPATH: `-m torch.distributed.run` and `-m offloadlab.train.worker` would otherwise import a
    # `torch/` or `offloadlab/` folder from the working directory first. TMPDIR: torchrun leaves an empty
    # torchelastic_* folder in the temp directory at every launch; this one is the run's and is removed.
    env = {**environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1", "TMPDIR": str(tmp)}
    if sets_pinned_exact(env):
        env["PYTORCH_ALLOC_CONF"] = PINNED_EXACT_ABOVE
    return env


class RendezvousError(RuntimeError):
    """The hosts of a run on several never met: no strategy can run until they do."""


@dataclass(frozen=True)
class Launch:
    """How torchrun starts each strategy; several hosts use torchrun's own (static) rendezvous."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500
    rdzv_timeout_s: int = 300
    """How long the hosts wait for one another (torchrun's own default, 600 s, looked like a hang)."""

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise SpecError(f"--nnodes {self.nnodes}: at least this host takes part, pass 1 or more")
        if not 0 <= self.node_rank < self.nnodes:
            raise SpecError(
                f"--node-rank {self.node_rank} is not a rank of --nnodes {self.nnodes}: pass 0 to {self.nnodes - 1} "
                "(0 on the host at --master-addr), each host its own"
            )
        if self.rdzv_timeout_s < 1:
            raise SpecError(f"--rdzv-timeout {self.rdzv_timeout_s}: pass the seconds the hosts wait, 1 or more")

    @property
    def master_host(self) -> str:
        return self.master_addr or "127.0.0.1"

    def worker_command(self, nproc: int) -> list[str]:
        """The command before the worker's own arguments. One process on this host is the worker alone
        (it takes a world of one: DistContext.from_env): torchrun's agent imported torch a second time
        before every launch (1.8 s, twice a strategy with its restore check) and held 0.4 GiB beside it."""
        if nproc == 1 and self.single_host:
            return [sys.executable, "-P"]
        return [sys.executable, "-P", "-m", "torch.distributed.run", *self._torchrun_args(nproc)]

    @property
    def single_host(self) -> bool:
        return self.nnodes == 1 and self.master_addr is None

    def _torchrun_args(self, nproc: int) -> list[str]:
        if self.single_host:
            return ["--standalone", f"--nproc-per-node={nproc}"]
        return [
            f"--nnodes={self.nnodes}",
            f"--node-rank={self.node_rank}",
            f"--nproc-per-node={nproc}",
            f"--master-addr={self.master_host}",
            f"--master-port={self.master_port}",
            f"--rdzv-conf=timeout={self.rdzv_timeout_s}",
        ]

    def check_hosts_met(self, output: str) -> None:
        """A launch whose torchrun gave up waiting for the other hosts (node 0: "1/2 clients joined"; another
        node: it could not reach node 0) raises RendezvousError: every later strategy would wait as long."""
        gave_up = re.search(r"torch\.distributed\.Dist(?:Store|Network)Error: (.+)", output)
        if self.nnodes > 1 and gave_up:
            raise RendezvousError(
                f"the {self.nnodes} hosts did not meet at --master-addr {self.master_host}:{self.master_port} "
                f"within --rdzv-timeout {self.rdzv_timeout_s} s (torchrun: {gave_up[1].strip()}): start this run "
                "on every host with its own --node-rank and the same --master-addr and --master-port, or raise "
                "--rdzv-timeout"
            )


def spec_toml(spec: RunSpec) -> str:
    """The spec as resolved (absolute paths, defaults filled in): what the workers and the store read."""
    return tomli_w.dumps(spec.model_dump(mode="json", exclude_none=True))


def new_run_dir(spec: RunSpec, out: Path | None) -> RunDir:
    """The run folder, checked to be new or empty; made by the caller after the preflight."""
    path = out or Path("runs") / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_new_folder(path)
    return RunDir.at(path)


def check_new_folder(path: Path) -> None:
    """An --out that is new or empty: a run (or a tune of runs) never writes among files it did not make."""
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--out {path} is a file: pass a folder that is new or empty")
    if path.is_dir() and any(path.iterdir()):
        raise RunDirError(f"run directory {path} exists and is not empty: pass another --out")


# torchrun's own log lines: "E1205 00:00:17.121000 3809 torch/distributed/elastic/...".
TORCHRUN_LOG_LINE = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d")


def _printed(output: str) -> list[str]:
    """The output's lines but blank ones and the `$ command` lines the runner writes."""
    return [line for line in output.splitlines() if line.strip() and not line.startswith("$ ")]


def crash_reason(rc: int, output: str) -> str:
    """Why a launch failed, from its output: a rank's last words before torchrun's report (an op's failed
    assertion; DeepSpeed's "mlock failed ..." before the assertion it trips; a rank that could not import
    offloadlab), not the report's last line, which is its "=====" rule."""
    report = output.find("failed (exitcode")
    said = [line for line in _printed(output if report < 0 else output[:report]) if not TORCHRUN_LOG_LINE.match(line)]
    last = said[-1][:300] if said else "no output"
    died = re.search(r"exitcode\s*: -\d+ \(pid: \d+\)\s*\((SIG\w+)\)", output)
    signal_name = died[1] if died else signal.Signals(-rc).name if rc < 0 else None  # torchrun's, or the rank's own
    if signal_name is None:
        return f"exited with code {rc}: {last}"
    mlock = next((line for line in said if line.startswith("mlock failed")), None)
    if mlock:
        return (
            f"a rank died of {signal_name}: {mlock[:200]}: DeepSpeed could not page-lock its NVMe swap buffers; "
            "raise ulimit -l (or run with CAP_IPC_LOCK)"
        )
    return f"a rank died of {signal_name}: {last}"


def oom_kills() -> int:
    """The kernel's count of OOM kills: the host's (/proc/vmstat) and this cgroup's (a container's limit)."""
    total = 0
    for path, key in ((Path("/proc/vmstat"), "oom_kill"), (Path("/sys/fs/cgroup/memory.events"), "oom_kill")):
        with contextlib.suppress(OSError, ValueError):
            total += next(int(v) for k, v in (line.split() for line in path.read_text().splitlines()) if k == key)
    return total


@dataclass
class StrategyJob:
    name: str
    strategy_id: int
    nvme_dir: Path | None
    log: Path
    proc: subprocess.Popen | None = None
    created: list[Path] = field(default_factory=list)
    steps_printed: int = 0
    phase: str | None = None
    """What the progress line says the strategy is doing, until its steps speak for it."""


class Runner:
    def __init__(
        self,
        spec: RunSpec,
        run_dir: RunDir,
        launch: Launch,
        console: Console,
        keep_checkpoints: bool = False,
        planned: dict[str, Planned] | None = None,
        tokens: np.ndarray | None = None,
    ):
        """tokens: the run's text read and checked before the run folder was made, saved in it for the ranks."""
        self.spec, self.run_dir, self.launch, self.console = spec, run_dir, launch, console
        self.keep_checkpoints = keep_checkpoints
        self.planned = planned or {}
        self.oom_kills_before = oom_kills()  # taken again at each launch
        run_dir.reserve_space()
        self.store = RunStore(run_dir.root, create_schema=True)
        self.run_id = self.store.add_run(spec.name, spec_toml(spec))
        (run_dir.root / "spec.toml").write_text(spec_toml(spec))
        (run_dir.root / "logs").mkdir(exist_ok=True)
        if tokens is not None:
            np.save(run_dir.tokens_cache, tokens)
        token = uuid.uuid4().hex[:8]  # no other run's swap folder has this name, whatever its run folder is called
        self.swap_secret = secrets.token_hex(16)  # in each swap folder's owner marker and in the store
        self.jobs = [self._job(s, token) for s in spec.strategy]

    def _job(self, strategy, token: str) -> StrategyJob:
        config = strategy.model_dump(mode="json")
        strategy_id = self.store.add_strategy(self.run_id, strategy.name, strategy.engine, config, self.spec.steps)
        if strategy.name in self.planned:
            record_plan(self.store, strategy_id, self.planned[strategy.name])
        nvme_dir = self.run_dir.nvme_dir(self.spec.nvme_path, token, strategy.name) if strategy.uses_nvme else None
        return StrategyJob(strategy.name, strategy_id, nvme_dir, self.run_dir.log(strategy.name))

    def say(self, message: str) -> None:
        """Print, unless the terminal is gone (a SIGHUP): cleanup must not stop at a failed write. Into a
        file or a pipe each line carries the time, as a log's would."""
        if not self.console.is_terminal:
            message = f"{time.strftime('%H:%M:%S')} {message}"
        with contextlib.suppress(OSError):
            self.console.print(message)

    def run(self) -> None:
        try:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            ) as progress:
                # Every strategy listed from the start; a pending one's clock starts when it does.
                tasks = [
                    progress.add_task(f"{job.name:<18} (pending)", total=self.spec.steps, start=False)
                    for job in self.jobs
                ]
                for number, (job, task) in enumerate(zip(self.jobs, tasks), start=1):
                    self._run_strategy(job, progress, task, f"{number} of {len(self.jobs)}")
            self.store.set_run_status(self.run_id, Status.DONE)
            self.run_dir.tokens_cache.unlink(missing_ok=True)
            self.run_dir.release_space()
        except BaseException as err:
            with signals_ignored():
                left = self._stop_and_clean_all(err)
            what = "interrupted" if isinstance(err, KeyboardInterrupt) else f"stopped ({type(err).__name__}: {err})"
            if left:
                self.say(
                    f"[yellow]{what}: stopped the running strategy; could not remove "
                    f"{', '.join(escape(str(p)) for p in left)}[/]"
                )
            else:
                self.say(
                    f"[yellow]{what}: stopped the running strategy and removed the NVMe, checkpoint, "
                    "scratch and temp folders the run made[/]"
                )
            raise
        finally:
            # Closed here, not when collected: a reader in this process (autotune reads each trial's store
            # right after it) saw the last status only in the WAL this open connection still held.
            self.store.close()

    def _stop_and_clean_all(self, err: BaseException) -> list[Path]:
        # Begins with the status's word, as ran_to_its_end reads it: stopped with the run, not finished.
        reason = (
            f"{Status.INTERRUPTED} by the user" if isinstance(err, KeyboardInterrupt) else f"the run stopped: {err}"
        )
        if is_disk_full(err):
            reason = f"the run folder's disk filled ({err}): free space on {self.run_dir.root}'s drive"
        left: list[Path] = []
        for job in self.jobs:
            self._stop(job)
            left += self._clean(job)  # first: on a full disk this frees the space the store's writes need
        with contextlib.suppress(OSError):
            self.run_dir.tokens_cache.unlink(missing_ok=True)
        self.run_dir.release_space()  # and so does the reserve, whatever filled the disk (the store itself)
        for job in self.jobs:
            with contextlib.suppress(sqlite3.Error):
                status = Status(self.store.strategy(job.strategy_id)["status"])
                if status.unfinished:  # one that never started says so: "failed (0/400)" alone read as a crash
                    why = f"{reason} before it started" if status is Status.PENDING else reason
                    self.store.set_strategy_status(job.strategy_id, Status.FAILED, why)
        with contextlib.suppress(sqlite3.Error):
            self.store.set_run_status(self.run_id, Status.INTERRUPTED)
        return left

    def _run_strategy(self, job: StrategyJob, progress: Progress, task, which: str) -> None:
        progress.start_task(task)
        began = time.monotonic()
        if not self.console.is_terminal:
            self.say(f"{job.name}: started ({which})")
        self.store.set_strategy_status(job.strategy_id, Status.RUNNING)
        if job.nvme_dir is not None:
            self.store.record_created(self.run_id, job.nvme_dir, self.swap_secret)
            job.nvme_dir.mkdir()
            job.created.append(job.nvme_dir)
            self.run_dir.mark_swap_folder(job.nvme_dir, self.swap_secret)
        try:
            rc = self._launch(job, "train", progress, task)
            if rc != 0 and self.store.strategy(job.strategy_id)["status"] == Status.RUNNING:
                self.store.set_strategy_status(job.strategy_id, *self._exit_reason(rc, job.log))
            elif rc == 0:
                if self.spec.verify_checkpoint:
                    self._stage(progress, task, job, "verifying checkpoint")
                    rc = self._launch(job, "verify", progress, None)
                    if rc != 0 and self.store.strategy(job.strategy_id)["checkpoint_verified"] is None:
                        self.store.set_checkpoint_result(job.strategy_id, False, self._exit_reason(rc, job.log)[1])
                    elif rc == 0 and self._restores_at_world_1(job):
                        self._stage(progress, task, job, "restoring at world size 1")
                        at_own_world = self.store.strategy(job.strategy_id)["checkpoint_detail"]
                        rc_world_1 = self._launch(job, "verify", progress, None, nproc=1)
                        if rc_world_1 != 0:
                            self.store.set_checkpoint_result(
                                job.strategy_id,
                                False,
                                f"{at_own_world} | restore at world size 1 failed: "
                                f"{self._exit_reason(rc_world_1, job.log)[1]}",
                            )
                self.store.set_strategy_status(job.strategy_id, Status.DONE)
        finally:
            self._clean(job)
        row = self.store.strategy(job.strategy_id)
        status = Status(row["status"])
        if status.finished:  # nothing more is written for it: compare, report and the TUI read these figures
            store_figures(self.store, job.strategy_id)
        progress.update(task, description=f"{job.name:<18} [{status.style}]{status.label}[/]")
        progress.stop_task(task)  # its clock stops with it, done or failed
        if not self.console.is_terminal:
            self.say(f"{job.name}: {status.label} after {int(time.monotonic() - began)} s")
        if row["reason"]:
            self.say(f"  {job.name}: {status.label}: {escape(row['reason'])} (log: {escape(str(job.log))})")
        if self._swapped_nothing(job):
            self.say(f"  {job.name} swapped nothing: {SWAPPED_NOTHING_WHY}")

    def _swapped_nothing(self, job: StrategyJob) -> bool:
        facts = ModelFacts.first_of(self.store.events(job.strategy_id, MODEL_FACTS_EVENT))
        return facts is not None and facts.swapped_nothing

    def _restores_at_world_1(self, job: StrategyJob) -> bool:
        """One host only: the check runs where rank 0 saved."""
        record = engine_for(self.spec.get_strategy(job.name))
        return self.spec.nproc > 1 and self.launch.nnodes == 1 and record.restores_at_other_world_size

    def _launch(self, job: StrategyJob, mode: str, progress: Progress, task, nproc: int | None = None) -> int:
        launch = self.launch if nproc is None else Launch()
        cmd = [
            *launch.worker_command(nproc or self.spec.nproc),
            "-m",
            "offloadlab.train.worker",
            "--run-dir",
            str(self.run_dir.root),
            "--strategy",
            job.name,
            "--mode",
            mode,
        ]
        if job.nvme_dir is not None:
            cmd += ["--nvme-dir", str(job.nvme_dir)]
        tmp = self.run_dir.job_tmp(job.name)
        tmp.mkdir(parents=True, exist_ok=True)
        self.oom_kills_before = oom_kills()
        token = secrets.token_hex(16)
        self.store.add_events(job.strategy_id, 0, [(None, LAUNCH_EVENT, time.time(), None, token)])
        with open(job.log, "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            # A session of its own, so Ctrl-C reaches the parent first and the parent stops the job whole.
            job.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**worker_env(os.environ, tmp), LAUNCH_TOKEN_ENV: token},
                cwd=self.run_dir.root,
                start_new_session=True,
            )
            while job.proc.poll() is None:
                if task is not None:
                    trained = self.store.steps_trained(job.strategy_id)
                    progress.update(task, completed=trained)
                    if not trained:
                        self._stage(progress, task, job, self._starting_phase(job))
                    elif job.phase is not None:
                        job.phase = None
                        progress.update(task, description=f"{job.name:<18}")
                    self._print_new_steps(job)
                time.sleep(0.3)
        if task is not None:
            progress.update(task, completed=self.store.steps_trained(job.strategy_id))
            self._print_new_steps(job)
        rc, job.proc = job.proc.returncode, None
        return rc

    def _stage(self, progress: Progress, task, job: StrategyJob, what: str) -> None:
        if what == job.phase:
            return
        job.phase = what
        progress.update(task, description=f"{job.name:<18} ({what})")
        if not self.console.is_terminal:
            self.say(f"{job.name}: {what}")

    def _starting_phase(self, job: StrategyJob) -> str:
        """Where a strategy's start is, from what its ranks have recorded: each records its process as it
        starts, and rank 0 the model's facts once its engine is built."""
        if not self.store.events(job.strategy_id, RANK_PROCESS_EVENT):
            return "starting ranks"
        if not self.store.events(job.strategy_id, MODEL_FACTS_EVENT):
            return "loading weights, building the engine" if self.spec.model.hf_model else "building the engine"
        return "first step"

    def _print_new_steps(self, job: StrategyJob) -> None:
        """Where stdout is a file or a pipe the progress bars draw nothing until the end: a plain line a
        step instead, as DeepSpeed and torchtitan print."""
        if self.console.is_terminal:
            return
        for r in self.store.steps(job.strategy_id, rank=0, after_step=job.steps_printed):
            self.say(
                f"{job.name} step {r.step}/{self.spec.steps} loss {r.loss:.4f} {r.step_time_s:.3f} s "
                f"{r.tokens_per_s:,.0f} tokens/s GPU {human_bytes(r.peak_allocated_bytes)} "
                f"host {human_bytes(r.host_rss_peak_bytes)}"
            )
            job.steps_printed = r.step

    def _exit_reason(self, rc: int, log: Path) -> tuple[Status, str]:
        """Why a job ended without recording a result itself (it was killed, or crashed before the store)."""
        text = log.read_text(errors="replace") if log.exists() else ""
        latest = text[text.rfind("\n$ ") + 1 :]  # this launch's output only; the log holds train and verify
        self.launch.check_hosts_met(latest)
        # torchrun exits 1 when a rank dies; it names the signal in its summary.
        if rc in (-signal.SIGKILL, 128 + signal.SIGKILL) or "SIGKILL" in latest or "exitcode  : -9" in latest:
            if oom_kills() > self.oom_kills_before:
                return Status.DOES_NOT_FIT, "killed by the kernel's OOM killer (host RAM): its oom_kill count went up"
            return Status.FAILED, (
                "killed by SIGKILL from outside offloadlab, not by the kernel's OOM killer "
                "(its oom_kill count did not move)"
            )
        return Status.FAILED, crash_reason(rc, latest)

    def _stop(self, job: StrategyJob) -> None:
        if job.proc is None or job.proc.poll() is not None:
            return
        os.killpg(job.proc.pid, signal.SIGTERM)
        try:
            job.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()

    def _clean(self, job: StrategyJob) -> list[Path]:
        """Remove what this strategy made; return what could not be removed."""
        for path in job.created:
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                with contextlib.suppress(sqlite3.Error):
                    self.store.forget_created(self.run_id, path)
        folders = [
            f
            for f in self.run_dir.per_strategy_folders(job.name)
            if not (self.keep_checkpoints and f == self.run_dir.checkpoints(job.name))
        ]
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                folder.parent.rmdir()  # checkpoints/, scratch/, tmp/ once no strategy has anything there
        left = [p for p in [*job.created, *folders] if p.exists()]
        job.created = [p for p in job.created if p.exists()]
        return left


def sweep_dead_runs(parent: Path, console: Console) -> None:
    """Runs beside this one whose process died (a closed terminal, SIGKILL) leave their swap folders on the
    NVMe drive: remove those they provably made, and mark such a run interrupted. A folder is looked at only
    if it is a real folder (no link) that no process holds, with a store marked as offloadlab's in its
    header (read as bytes: another program's database or an empty file is never opened); its store is read
    read-only, and written only once one of its swap folders is proven its own: the folder's owner marker
    names this very run folder (device and inode) and the secret the store recorded. So a copy of a live
    run's folder, or a crafted store naming any path, changes nothing."""
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        folders = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    for folder in folders:
        run_dir = RunDir(folder)
        if not is_run_store(run_dir.store_path) or run_dir.is_live():
            continue
        try:
            _remove_dead_runs_swap(run_dir, console)
        except (StoreError, LookupError, sqlite3.Error, OSError) as err:
            console.print(f"left {escape(str(folder))} as it is: {escape(str(err))}")


def _remove_dead_runs_swap(run_dir: RunDir, console: Console) -> None:
    reader = RunStore(run_dir.root)
    try:
        run = reader.run()
        created = reader.created(run["id"]) if Status(run["status"]) is Status.RUNNING else []
    finally:
        reader.close()
    owned = [path for path, secret in created if run_dir.owns_swap_folder(path, secret)]
    if not owned:
        return
    store = RunStore(run_dir.root, writable=True)
    try:
        store.mark_interrupted(run["id"])
        for path in owned:
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                store.forget_created(run["id"], path)
    finally:
        store.close()
    removed = ", ".join(escape(str(p)) for p in owned if not p.exists())
    console.print(
        f"marked {escape(str(run_dir.root))} interrupted (its process was gone) and removed its swap folders {removed}"
    )


def _read_data(spec: RunSpec, console: Console) -> np.ndarray | None:
    """The run's data read and checked once, before the run folder is made, with the tokenizer's progress."""
    if spec.data.kind != "text":
        return run_tokens(spec)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"tokenizing {spec.data.path.name}", total=None)
        return run_tokens(spec, lambda done, total: progress.update(task, completed=done, total=total))


def run_spec(
    spec: RunSpec,
    out: Path | None,
    launch: Launch,
    console: Console,
    keep_checkpoints: bool = False,
    force: bool = False,
    plan_path: Path | None = None,
) -> Path:
    """plan_path: `offloadlab plan --json` output whose predictions the run is shown against."""
    from offloadlab.plan.output import planned_for_spec

    run_dir = new_run_dir(spec, out)
    shape = preflight_run(spec, run_dir.root)
    tokens = _read_data(spec, console)
    planned = planned_for_spec(plan_path, spec, shape) if plan_path else None
    check_fits(spec, shape, console, force)
    # Built here, once, with the wait explained, rather than by the first rank that needs it inside a job.
    ensure_built((op for s in spec.strategy for op in s.ops_needed), announce_on(console))
    run_dir.root.mkdir(parents=True, exist_ok=True)
    lock = run_dir.lock()
    try:
        new_run_dir(spec, run_dir.root)  # again under the lock: of two runs started together, one stops here
        sweep_dead_runs(run_dir.root.parent, console)
        Runner(spec, run_dir, launch, console, keep_checkpoints, planned, tokens).run()
    finally:
        os.close(lock)
    return run_dir.root
