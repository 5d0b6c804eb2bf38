"""DeepSpeed's ops: built once per venv, loaded by every process without a rebuild, and a build killed part-way
never leaves a lock that hangs the next one or a library that was never finished."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, write_spec
from offloadlab.engines import ops
from offloadlab.results.store import RunStore

LOAD = (
    "import sys; from offloadlab.engines.ops import is_built, load_op; print('built before:', is_built(sys.argv[1])); "
    "load_op(sys.argv[1])"
)


def _load_in_new_process(op: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", LOAD, op], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )


def _fingerprint(folders: list[Path]) -> dict[str, tuple[int, str]]:
    """The built library's modification time and ninja's record of every command: a rebuild changes both."""
    return {f.name: ((f / f"{f.name}.so").stat().st_mtime_ns, (f / ".ninja_log").read_text()) for f in folders}


@pytest.mark.slow
def test_one_build_serves_processes_with_another_path_cflags_and_cxx():
    """A system ninja reads the venv ninja's log as 'every command changed' (1.11 vs 1.13 here: a 3-minute
    rebuild of async_io), and $CXX goes into every command: both are pinned, so nothing rebuilds."""
    venv_bin = str(Path(sys.executable).parent)
    activated = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}", "CFLAGS": "-O2 -I/nonexistent"}
    other_path = [p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin]
    plain = {**os.environ, "PATH": os.pathsep.join(other_path), "CXX": "g++"}
    plain.pop("CFLAGS", None)
    first = _load_in_new_process("async_io", activated)  # builds only if setup has not
    assert first.returncode == 0, first.stderr[-3000:]
    folders = ops.build_folders("async_io")
    before = _fingerprint(folders)
    for env in (plain, activated):
        proc = _load_in_new_process("async_io", env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "built before: True" in proc.stdout
    assert _fingerprint(folders) == before


@pytest.mark.slow
def test_a_dead_holders_torch_lock_is_removed_and_a_live_builders_is_waited_for(tmp_path):
    """An idle process working in the folder (a shell, here a sleep) hung `run` at 0/4 for ever: only a
    build tool there is a live build, and the wait names it."""
    folder = tmp_path / "cpu_adam"
    folder.mkdir()
    lock = folder / "lock"
    lock.touch()
    idle = subprocess.Popen(["sleep", "600"], cwd=folder)
    try:
        start = time.monotonic()
        ops._clear_stale_torch_lock(folder, say=pytest.fail)  # not waited on, nothing said
        assert time.monotonic() - start < 1 and not lock.exists()
    finally:
        idle.kill()
        idle.wait()
    ninja = tmp_path / "ninja"  # a build tool by its name, as ninja runs in the folder during a build
    shutil.copy(shutil.which("sleep"), ninja)
    lock.touch()
    builder = subprocess.Popen([str(ninja), "2"], cwd=folder)
    said: list[str] = []
    start = time.monotonic()
    ops._clear_stale_torch_lock(folder, say=said.append)
    assert builder.poll() is not None and time.monotonic() - start > 1.5  # it waited for the live one
    assert said == [f"waiting for ninja (PID {builder.pid}), which is building in {folder}"]
    assert not lock.exists()  # and then removed what its dead holder left


def test_a_wait_for_another_offloadlab_build_names_its_pid(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from offloadlab.engines import ops\n"
            "with ops._build_lock(Path(sys.argv[1]), print):\n    print('locked', flush=True); time.sleep(2)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    said: list[str] = []
    start = time.monotonic()
    with ops._build_lock(tmp_path, said.append):
        assert time.monotonic() - start > 1  # acquired once the holder let go
    holder.wait()
    assert said == [f"waiting for offloadlab process {holder.pid}, which is building DeepSpeed's ops in {tmp_path}"]


def test_the_build_lock_is_released_when_its_holder_is_killed(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; "
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(600)",
            str(tmp_path / ops.LOCK_FILE),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    fd = os.open(tmp_path / ops.LOCK_FILE, os.O_RDWR)
    with pytest.raises(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with ops._build_lock(tmp_path, pytest.fail):  # acquired at once: the kernel dropped the dead holder's lock
        pass
    os.close(fd)


def _compiler_running_in(folder: Path) -> bool:
    for proc in psutil.process_iter(["name", "cwd"]):
        if proc.info["cwd"] and Path(proc.info["cwd"]) == folder and proc.info["name"] in ("cc1plus", "c++", "g++"):
            return True
    return False


@pytest.mark.slow
def test_a_build_killed_part_way_is_redone_by_the_next_run(tmp_path):
    """Seen by a new user: a killed cpu_adam build left torch's lock; the next strategy waited on it for ever,
    and once it was deleted torch imported a cpu_adam.so that was never built. Here the op killed is the
    smallest every DeepSpeed strategy on the CPU loads (its shared-memory collectives, ~25 s to build); the
    venv's built cpu_adam is copied in, so the run builds only what the kill broke."""
    extensions = tmp_path / "extensions"
    extensions.mkdir()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "DS_ACCELERATOR": "cpu"}
    ops.load_op("cpu_adam")  # built at setup; built here otherwise
    shutil.copytree(ops.build_folders("cpu_adam")[0], extensions / "cpu_adam")  # copy2 keeps ninja's mtimes
    build = subprocess.Popen(
        [sys.executable, "-c", LOAD, "deepspeed_shm_comm"],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    folder = extensions / "deepspeed_shm_comm"
    deadline = time.monotonic() + 300
    while not _compiler_running_in(folder):
        assert build.poll() is None and time.monotonic() < deadline, "the build never reached the compiler"
        time.sleep(0.2)
    os.killpg(build.pid, signal.SIGKILL)  # the whole build: python, ninja and the compilers
    build.wait()
    assert (folder / "lock").exists() and not (folder / "deepspeed_shm_comm.so").exists()

    spec = write_spec(
        tmp_path,
        [dict(name="zero2-cpu", engine="deepspeed", zero_stage=2, offload_optimizer="cpu")],
        steps=2,
        verify_checkpoint=False,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "offloadlab.cli", "run", str(spec), "--out", str(tmp_path / "run")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "building DeepSpeed's deepspeed_shm_comm op (first use, under a minute)" in proc.stdout
    assert "cpu_adam op" not in proc.stdout  # the copied build served as it was
    store = RunStore(tmp_path / "run")
    (row,) = store.strategies(store.run()["id"])
    assert row["status"] == "done"
    assert not (folder / "lock").exists()


@pytest.mark.slow
def test_a_strategy_that_fails_for_a_reason_other_than_size_fails_the_run(tmp_path):
    """'does not fit' is a result (exit 0); a failure is something to fix, and scripts must see it. Here the
    rank dies mid-run (killed by this test, by its PID; bad data is refused before any process now)."""
    spec = write_spec(tmp_path, [dict(name="fsdp2", engine="fsdp2")], verify_checkpoint=False, steps=400)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "COLUMNS": "200"}
    offloadlab = Path(sys.executable).parent / "offloadlab"
    with subprocess.Popen(
        [str(offloadlab), "run", str(spec), "--out", str(tmp_path / "run")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        deadline = time.monotonic() + 300
        while not _steps_trained(tmp_path / "run") and time.monotonic() < deadline:
            time.sleep(0.5)
        workers = [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "offloadlab.train.worker" in " ".join(p.cmdline())
        ]
        assert workers, "no rank to stop"
        workers[0].kill()
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stdout
    assert "fsdp2: failed: killed by SIGKILL" in " ".join(stdout.split())
    assert "fsdp2 failed (reasons above" in stderr


def _steps_trained(run_dir: Path) -> int:
    try:
        store = RunStore(run_dir)
        try:
            return sum(store.steps_trained(row["id"]) for row in store.strategies(store.run()["id"]))
        finally:
            store.close()
    except Exception:  # noqa: BLE001 - not there yet
        return 0


CPU_INFO = """
import json, os, sys
from offloadlab.engines import ops
ops.ensure_built(["cpu_adam"])
asked = json.loads(os.environ[ops.CPU_INFO_ENV])
os.environ[ops.CPU_INFO_ENV] = sys.argv[1]
ops._cpu_info_json.cache_clear()
ops.ask_cpu_info_once()
print(json.dumps([sorted(asked), ops._builder("cpu_adam").simd_width()]))
"""


def test_the_cpu_is_asked_once_and_its_answer_handed_to_the_ranks():
    """The parent asks py-cpuinfo and puts the answer in the ranks' environment; a rank's DeepSpeed then
    builds its compiler flags from that answer (here one without AVX) instead of asking again."""
    given = json.dumps({"arch": "X86_64", "flags": ["sse2"], "brand_raw": "given"})
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.pop(ops.CPU_INFO_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", CPU_INFO, given], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    asked_keys, simd = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"arch", "flags"} <= set(asked_keys)
    assert simd == "-D__SCALAR__"


def test_the_cpus_answer_is_kept_beside_the_ops_under_the_cpus_identity(tmp_path):
    """py-cpuinfo takes a second a process (a third of `doctor`): its answer is stored with what it depends
    on, read back by the next process on the same CPU, and asked again for another CPU or a spoilt file."""
    cache, asked = tmp_path / ops.CPU_INFO_FILE, []

    def ask() -> dict:
        asked.append(1)
        return {"arch": "X86_64", "flags": ["avx2"], "asked": len(asked)}

    def never() -> dict:
        raise AssertionError("asked again for the same CPU")

    first = ops._cached_cpu_info(cache, ask)
    assert json.loads(first)["asked"] == 1 and json.loads(cache.read_text())["cpu"] == ops.cpu_identity()
    assert ops._cached_cpu_info(cache, never) == first
    assert [p.name for p in tmp_path.iterdir()] == [ops.CPU_INFO_FILE]  # no partial file left
    cache.write_text(json.dumps({"cpu": "another CPU", "info": {"arch": "ARM_8"}}))
    assert json.loads(ops._cached_cpu_info(cache, ask))["asked"] == 2
    cache.write_text("{ spoilt")
    assert json.loads(ops._cached_cpu_info(cache, ask))["asked"] == 3
    assert ops._cached_cpu_info(cache, never) == json.dumps(json.loads(cache.read_text())["info"])
