"""Shared helpers: real runs of the real CLI in subprocesses, on the CPU (DeepSpeed's CPU accelerator, gloo)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest
import tomli_w

from offloadlab.results.store import DB_NAME, RunStore, StoreError

REPO = Path(__file__).resolve().parents[1]

# Fixtures that train or tune for real (once per session or module): every test using one is slow.
REAL_RUN_FIXTURES = {"world1", "world2", "swapping_run", "tuned_dir", "tuned"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`pytest -m "not slow"` is the quick loop: tests marked slow themselves train or start offloadlab's
    processes, and a test that needs a real run is slow through its fixture."""
    for item in items:
        if REAL_RUN_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


TINY = dict(seed=0, steps=4, seq_len=32, micro_batch=2, grad_accum=2, precision="fp32", model=dict(preset="tiny"))


def write_spec(folder: Path, strategies: list[dict], **overrides) -> Path:
    raw = {**TINY, "name": "t", **overrides, "strategy": strategies}
    path = folder / "spec.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


def flat(text: str) -> str:
    """Output with rich's line wrapping undone, so a message is found whatever the terminal width."""
    return " ".join(text.replace("│", " ").split())


def h200_budget_run_with_its_plan(tmp_path: Path) -> tuple[Path, dict]:
    """Session 12's H200 run held to 24 GiB, with the plan made for it on that machine attached as
    `run --plan` attaches one; returns the run folder and the plan's figures by strategy."""
    from offloadlab.plan.output import planned_for_spec
    from offloadlab.results.summary import record_plan
    from offloadlab.run.preflight import preflight_run
    from offloadlab.spec import load_spec

    results = REPO / "bench/results/2026-12-04-h200-s12"
    with tarfile.open(results / "budget_stores.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    run_dir = tmp_path / "b24"
    spec = load_spec(run_dir / "spec.toml")
    planned = planned_for_spec(results / "plan_24.json", spec, preflight_run(spec, tmp_path / "unused"))
    store = RunStore(run_dir, writable=True)
    for row in store.strategies(store.run()["id"]):
        record_plan(store, row["id"], planned[row["name"]])
    store.close()
    return run_dir, planned


def copy_store(source_run_dir: Path, dest_run_dir: Path) -> Path:
    """A consistent copy of a run store (SQLite's backup API, WAL content included)."""
    dest_run_dir.mkdir(parents=True)
    with sqlite3.connect(source_run_dir / DB_NAME) as src, sqlite3.connect(dest_run_dir / DB_NAME) as dst:
        src.backup(dst)
    return dest_run_dir


def cli(*args: str, timeout: float = 900, check: bool = True, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`offloadlab ARGS` as a user types it (the installed entry point), from `cwd`."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "COLUMNS": "200"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "offloadlab"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"offloadlab {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def nvme_root(tmp_path_factory) -> Path:
    """A folder on the real disk (O_DIRECT works there), standing in for the user's NVMe mount."""
    return tmp_path_factory.mktemp("nvme")


STRATEGIES = [
    dict(name="zero2-cpu", engine="deepspeed", zero_stage=2, offload_optimizer="cpu"),
    dict(
        name="zero3-nvme",
        engine="deepspeed",
        zero_stage=3,
        offload_optimizer="nvme",
        offload_param="nvme",
        buffer_count=5,
        buffer_size=1_000_000,
    ),
    dict(name="fsdp2", engine="fsdp2"),
    dict(name="fsdp2-cpu-offload", engine="fsdp2", cpu_offload=True),
]


@pytest.fixture(scope="session")
def world1(tmp_path_factory, nvme_root) -> Path:
    """Every test strategy on one rank, run against the plan made for it (`plan --json`, then `run --plan`)."""
    folder = tmp_path_factory.mktemp("world1")
    spec = write_spec(folder, STRATEGIES, nvme_path=str(nvme_root))
    (folder / "plan.json").write_text(cli("plan", str(spec), "--json").stdout)
    ran = cli("run", str(spec), "--out", str(folder / "run"), "--plan", str(folder / "plan.json"))
    (folder / "run.out").write_text(ran.stdout)  # what the user saw (piped), for tests of its lines
    return folder / "run"


@pytest.fixture(scope="session")
def world2(tmp_path_factory, nvme_root) -> Path:
    """The same effective batch over two gloo ranks: grad_accum halves as nproc doubles."""
    folder = tmp_path_factory.mktemp("world2")
    strategies = [STRATEGIES[1], STRATEGIES[3]]
    spec = write_spec(folder, strategies, nvme_path=str(nvme_root), nproc=2, grad_accum=1)
    cli("run", str(spec), "--out", str(folder / "run"))
    return folder / "run"


def load_bench(name: str):
    """A script of bench/ as a module, for tests of its own logic."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# How a shell sees a CLI stopped by Ctrl-C: exit status 130, or death by SIGINT, which it also shows as 130.
# The CLI exits 130 after its cleanup, but about one Ctrl-C in 40 early in a tune ended the process by
# SIGINT after that cleanup had run and printed (Python 3.11 on CI; the cause was not found).
CTRL_C_EXIT = (130, -signal.SIGINT)


def start_cli(*args: str) -> subprocess.Popen:
    """The CLI started as a shell starts a background job (`offloadlab run ... &`): with SIGINT ignored.
    Python then sets no Ctrl-C handler of its own; a SIGINT (`kill -INT`) must still stop it and clean up.
    """
    return subprocess.Popen(
        [sys.executable, "-m", "offloadlab.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


def wait_for_worker(proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> psutil.Process:
    """The worker process of the first strategy, once it has trained a step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else f"exited {proc.returncode}"
        if (run_dir / "offloadlab.sqlite").exists():
            try:
                store = RunStore(run_dir)
                trained = store.conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0] > 0
                store.close()
            except (StoreError, sqlite3.OperationalError):
                trained = False  # the runner has opened the file but not yet created the schema
            if trained:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    try:
                        cmdline = " ".join(child.cmdline())
                    except psutil.Error:
                        continue  # a process that exited while listed
                    if "offloadlab.train.worker" in cmdline and "torch.distributed.run" not in cmdline:
                        return child
        time.sleep(0.2)
    raise AssertionError("the first strategy never trained a step")
