"""Safety: nothing outside the tool's own folders is touched, no code from the current folder runs, no run is
orphaned or corrupted. Each case was reproduced against the tool before it was fixed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import CTRL_C_EXIT, REPO, STRATEGIES, cli, flat, start_cli, wait_for_worker, write_spec
from offloadlab.checks import host as preflight
from offloadlab.results.rundir import RunDir, RunDirError
from offloadlab.results.store import DB_NAME, RunStore
from offloadlab.results.summary import summarize

OFFLOADLAB = str(Path(sys.executable).parent / "offloadlab")  # the console script, as a user starts it
FSDP2 = dict(name="fsdp2", engine="fsdp2")


def _worker_pids(run_dir: Path) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "offloadlab.train.worker" in cmdline and str(run_dir) in cmdline:
            pids.append(proc.pid)
    return pids


def _gone(pids: list[int], timeout: float = 30) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("name", ["../..", "a/b", ".hidden", "x y"])
def test_unsafe_strategy_names_are_refused_before_anything_is_made(tmp_path, name):
    """A strategy named '../..' used to delete the run folder's parent (an earlier run's folder with it)."""
    earlier = tmp_path / "earlier-run"
    earlier.mkdir()
    (earlier / "keep.txt").write_text("an earlier run")
    spec = write_spec(tmp_path, [FSDP2 | {"name": name}])
    proc = cli("run", str(spec), "--out", str(tmp_path / "runs" / "r1"), check=False)
    assert proc.returncode == 2 and "is not a usable name" in flat(proc.stdout), proc.stdout
    assert (earlier / "keep.txt").read_text() == "an earlier run"
    assert not (tmp_path / "runs").exists()


def test_every_path_in_the_run_folder_stays_inside_it(tmp_path):
    run_dir = RunDir.at(tmp_path / "run")
    assert run_dir.checkpoints("ok").parent.parent == run_dir.root
    with pytest.raises(RunDirError, match="outside the run folder"):
        run_dir.checkpoints("../../elsewhere")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "scratch").symlink_to(tmp_path)  # a link out of the folder is refused too
    with pytest.raises(RunDirError, match="outside the run folder"):
        run_dir.scratch("x")


def test_a_run_folder_stays_locked_whatever_is_deleted_in_it(tmp_path):
    """The lock was a file: `.offloadlab.lock` deleted mid-run let a second run into the folder."""
    run_dir = RunDir.at(tmp_path / "run")
    run_dir.root.mkdir()
    (run_dir.root / "spec.toml").write_text("")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from offloadlab.results.rundir import "
            "RunDir; RunDir.at(Path(sys.argv[1])).lock(); print('held', flush=True); time.sleep(600)",
            str(run_dir.root),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for path in run_dir.root.iterdir():
            path.unlink()
        assert run_dir.is_live()
        with pytest.raises(RunDirError, match="another offloadlab process is running"):
            run_dir.lock()
    finally:
        holder.kill()
        holder.wait()
    assert not run_dir.is_live()
    os.close(run_dir.lock())


@pytest.mark.slow
def test_modules_planted_in_the_current_folder_never_run(tmp_path):
    """`python -m torch.distributed.run` from the user's folder imported a planted torch/ there (every strategy
    failed with 'planted'), and `offloadlab tui` ran a planted tui/__main__.py."""
    planted = tmp_path / "cwd"
    marker = tmp_path / "planted-code-ran"
    for package in ("torch", "offloadlab", "tui", "offloadlab_tui"):
        (planted / package).mkdir(parents=True)
        for module in ("__init__.py", "__main__.py"):
            (planted / package / module).write_text(f"open({str(marker)!r}, 'a').write('{package}')\n")
    spec = write_spec(tmp_path, [FSDP2], steps=2, verify_checkpoint=False)
    run = subprocess.run(
        [OFFLOADLAB, "run", str(spec), "--out", str(tmp_path / "run")],
        cwd=planted,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    tui = subprocess.Popen(
        [OFFLOADLAB, "tui", "--root", str(tmp_path)],
        cwd=planted,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(8)
    tui.kill()
    tui.wait()
    assert not marker.exists(), marker.read_text()


def test_the_restore_check_never_unpickles_code(tmp_path):
    """A .pt planted in a checkpoint folder was unpickled (weights_only=False) by the restore check."""
    from offloadlab.engines.deepspeed_engine import digest_checkpoint_files

    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    import torch

    (tmp_path / "state").mkdir()
    torch.save({"x": Payload()}, tmp_path / "state" / "planted.pt")  # a real checkpoint file, with a payload
    with pytest.raises(pickle.UnpicklingError):
        digest_checkpoint_files(tmp_path / "state")
    assert not marker.exists()


class _Payload:
    """Unpickling it creates the marker file: code from the checkpoint folder ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _plant_deepspeed(step: Path, marker: Path) -> Path:
    import torch

    (target,) = step.rglob("mp_rank_00_model_states.pt")  # DeepSpeed loads it with weights_only=False
    torch.save({"module": _Payload(marker)}, target)
    return target


def _plant_fsdp2(step: Path, marker: Path) -> Path:
    target = step / ".metadata"  # torch.distributed.checkpoint's FileSystemReader pickle.loads it
    target.write_bytes(pickle.dumps(_Payload(marker)))
    return target


@pytest.mark.slow
def test_a_payload_planted_in_a_saved_checkpoint_is_refused_not_run(tmp_path):
    """DeepSpeed 0.19.8's load_checkpoint calls torch.load(weights_only=False) and FSDP2's reader
    pickle.loads .metadata: a file replaced between the save and the restore check ran its code."""
    spec = write_spec(tmp_path, [STRATEGIES[0], FSDP2], verify_checkpoint=True)
    run_dir = tmp_path / "run"
    cli("run", str(spec), "--out", str(run_dir), "--keep-checkpoints")
    for name, plant in (("zero2-cpu", _plant_deepspeed), ("fsdp2", _plant_fsdp2)):
        marker = tmp_path / f"{name}-payload-ran"
        (step,) = (run_dir / "checkpoints" / name).glob("step-*")
        planted = plant(step, marker)
        log = (run_dir / "logs" / f"{name}.log").read_text()
        verify = next(line[2:] for line in log.splitlines() if line.startswith("$ ") and "--mode verify" in line)
        (run_dir / "tmp").mkdir(exist_ok=True)
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONSAFEPATH": "1", "TMPDIR": str(run_dir / "tmp")}
        again = subprocess.run(verify.split(), cwd=run_dir, env=env, capture_output=True, text=True, timeout=600)
        assert again.returncode != 0
        assert not marker.exists(), f"{name}: the planted {planted.name} was unpickled"
        store = RunStore(run_dir)
        row = store.strategy(store.strategy_id(store.run()["id"], name))
        store.close()
        assert not row["checkpoint_verified"]
        assert f"was not loaded: changed since the save {planted.relative_to(step)}" in row["checkpoint_detail"]


def _dead_run_left_running(tmp_path: Path, nvme_root: Path, sig: int) -> tuple[Path, list[int]]:
    spec = write_spec(tmp_path, [STRATEGIES[1] | {"name": "orphan"}], steps=3000, nvme_path=str(nvme_root))
    run_dir = tmp_path / "runs" / "r1"
    proc = start_cli("run", str(spec), "--out", str(run_dir))
    wait_for_worker(proc, run_dir)
    pids = _worker_pids(run_dir)
    assert pids
    proc.send_signal(sig)
    proc.communicate(timeout=120)
    return run_dir, pids


@pytest.mark.slow
def test_a_closed_terminal_stops_the_run_and_cleans_up_like_ctrl_c(tmp_path, nvme_root):
    run_dir, pids = _dead_run_left_running(tmp_path, nvme_root, signal.SIGHUP)
    assert _gone(pids)
    assert not [p for p in nvme_root.iterdir() if p.name.endswith("-orphan")]
    store = RunStore(run_dir)
    assert store.run_status() == "interrupted"


@pytest.mark.slow
def test_a_killed_cli_takes_its_workers_with_it_and_the_next_run_removes_its_swap_folder(tmp_path, nvme_root):
    """SIGKILL of the CLI left torchrun, the worker and the sampler training to the last step (sessions of
    their own), the swap folder for ever and the store at 'running'."""
    run_dir, pids = _dead_run_left_running(tmp_path, nvme_root, signal.SIGKILL)
    assert _gone(pids), "the workers outlived the CLI"
    swap = [p for p in nvme_root.iterdir() if p.name.endswith("-orphan")]
    assert swap  # the CLI had no chance to clean: its store records the folder
    summaries = cli("compare", str(run_dir), "--json")
    assert '"status": "failed"' in summaries.stdout and "interrupted: offloadlab's process ended" in summaries.stdout
    spec = write_spec(tmp_path, [FSDP2], steps=1, verify_checkpoint=False)
    later = cli("run", str(spec), "--out", str(tmp_path / "runs" / "r2"))
    assert f"marked {run_dir} interrupted" in flat(later.stdout)
    assert not any(p.exists() for p in swap)
    assert RunStore(run_dir).run()["status"] == "interrupted"


def _tree_digest(*roots: Path) -> dict[str, str]:
    """Every file and link under the roots, by content: what a sweep must leave byte-identical."""
    out = {}
    for root in roots:
        for path in sorted([root, *root.rglob("*")]):
            if path.is_symlink():
                out[str(path)] = f"-> {os.readlink(path)}"
            elif path.is_file():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[str(path)] = "dir"
    return out


def _steps_trained(run_dir: Path) -> int:
    store = RunStore(run_dir)
    try:
        return store.conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0]
    finally:
        store.close()


@pytest.mark.slow
def test_a_new_run_changes_nothing_beside_it_that_is_not_provably_a_dead_runs_own(tmp_path, nvme_root):
    """Seen by a hostile user: a backup copy of a live run's folder made the next run remove the live run's
    swap folder (it died at step 13 in DeepSpeed's async_pwrite); a crafted store deleted a folder outside
    offloadlab's; a user's own database beside the runs was switched to WAL, and an empty file became one."""
    runs = tmp_path / "runs"
    live_spec = write_spec(tmp_path, [STRATEGIES[1] | {"name": "live"}], steps=3000, nvme_path=str(nvme_root))
    live = start_cli("run", str(live_spec), "--out", str(runs / "A"))
    try:
        wait_for_worker(live, runs / "A")
        (live_swap,) = [p for p in nvme_root.iterdir() if p.name.endswith("-live")]
        subprocess.run(["cp", "-a", str(runs / "A"), str(runs / "A-backup")], check=True)
        victim = tmp_path / "victim" / "offloadlab-precious"
        victim.mkdir(parents=True)
        (victim / "data.txt").write_text("the user's own")
        live_store = RunStore(runs / "A")
        ((_, live_secret),) = live_store.created(live_store.run()["id"])
        live_store.close()
        (runs / "evil").mkdir()
        evil = RunStore(runs / "evil", create_schema=True)  # a store as offloadlab writes one, crafted
        evil_run = evil.add_run("evil", "")
        evil.record_created(evil_run, victim, "guessed")
        evil.record_created(evil_run, live_swap, live_secret)  # the live run's folder, with its real secret
        evil.close()
        (runs / "foreign").mkdir()
        with contextlib.closing(sqlite3.connect(runs / "foreign" / DB_NAME)) as foreign:
            foreign.execute("CREATE TABLE runs (id INTEGER, status TEXT)")
            foreign.execute("INSERT INTO runs VALUES (1, 'running')")
            foreign.commit()
        (runs / "emptyfile").mkdir()
        (runs / "emptyfile" / DB_NAME).touch()
        (runs / "loop").symlink_to(runs / "loop")  # every later run into this parent failed on it
        beside = [runs / n for n in ("A-backup", "evil", "foreign", "emptyfile")]
        before = _tree_digest(tmp_path / "victim", *beside)
        trained_before = _steps_trained(runs / "A")

        spec = write_spec(tmp_path, [FSDP2], steps=1, verify_checkpoint=False)
        later = cli("run", str(spec), "--out", str(runs / "B"))
        assert "marked" not in later.stdout, later.stdout
        cli("compare", str(runs / "B"))  # reads its siblings for a stored baseline

        assert _tree_digest(tmp_path / "victim", *beside) == before
        assert (runs / "loop").is_symlink()
        assert live_swap.is_dir() and live.poll() is None
        deadline = time.time() + 120
        while _steps_trained(runs / "A") < trained_before + 2:  # the live run goes on swapping
            assert live.poll() is None and time.time() < deadline, (
                live.stdout.read() if live.poll() is not None else ""
            )
            time.sleep(0.5)
    finally:
        live.send_signal(signal.SIGINT)
        live.communicate(timeout=120)
    assert not live_swap.exists()  # its own run removed it at the end


@contextlib.contextmanager
def _small_disk(folder: Path, size: str):
    """A filesystem of its own (tmpfs), so a test can fill it."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _fill(path: Path) -> None:
    with open(path, "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()


@pytest.mark.slow
def test_a_run_whose_disk_fills_records_why(tmp_path):
    """The run's store had no room left for its last writes, so the run read as "a closed terminal, or
    killed"; a reserve the run holds is freed for them."""
    spec = write_spec(tmp_path, [FSDP2], steps=3000, verify_checkpoint=False)
    with _small_disk(tmp_path / "disk", "16m") as disk:
        run_dir = disk / "run"
        proc = start_cli("run", str(spec), "--out", str(run_dir))
        wait_for_worker(proc, run_dir)
        _fill(disk / "someone-elses-file")  # another program fills the drive
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1, out
        assert "its store could not be written (database or disk is full)" in flat(out)
        (disk / "someone-elses-file").unlink()
        (summary,) = json.loads(cli("compare", str(run_dir), "--json").stdout)
        assert summary["status"] == "failed" and "disk filled" in summary["reason"], summary
        assert sorted(p.name for p in run_dir.iterdir()) == ["logs", DB_NAME, "spec.toml"]


@pytest.mark.slow
def test_a_second_ctrl_c_does_not_cut_the_cleanup_short(tmp_path, nvme_root):
    spec = write_spec(tmp_path, [STRATEGIES[1] | {"name": "twice"}], steps=3000, nvme_path=str(nvme_root))
    run_dir = tmp_path / "run"
    proc = start_cli("run", str(spec), "--out", str(run_dir))
    wait_for_worker(proc, run_dir)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in CTRL_C_EXIT, out
    assert "removed the NVMe, checkpoint, scratch and temp folders the run made" in flat(out)
    assert not [p for p in nvme_root.iterdir() if p.name.endswith("-twice")]
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "scratch").exists()


@pytest.mark.slow
def test_two_runs_into_one_folder_one_is_refused_and_the_other_is_whole(tmp_path):
    spec = write_spec(tmp_path, [FSDP2], steps=30, verify_checkpoint=False)
    out = tmp_path / "run"
    first = start_cli("run", str(spec), "--out", str(out))
    time.sleep(0.5)
    second = start_cli("run", str(spec), "--out", str(out))
    outputs = [p.communicate(timeout=600)[0] for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert codes == [0, 2], outputs
    refused = outputs[[first.returncode, second.returncode].index(2)]
    assert "another offloadlab process is running" in flat(refused) or "exists and is not empty" in flat(refused)
    store = RunStore(out)
    (row,) = store.strategies(store.run()["id"])
    assert row["status"] == "done" and len(store.steps(row["id"])) == 30
    tune = cli("tune", "--nvme", str(tmp_path), "--quick", "--out", str(out), check=False)
    assert tune.returncode == 2 and "holds a run store already" in flat(tune.stdout)


@pytest.mark.slow
def test_a_spec_the_plan_says_cannot_fit_is_refused_before_any_work(tmp_path):
    spec = write_spec(
        tmp_path,
        [dict(name="z3", engine="deepspeed", zero_stage=3, offload_optimizer="cpu", offload_param="cpu")],
        model=dict(preset="gpt-70b"),
        precision="bf16",
        verify_checkpoint=False,
    )
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2, proc.stdout
    assert "the plan says no strategy of this spec fits this machine (z3 needs host RAM" in flat(proc.stdout)
    assert "--force runs it anyway" in flat(proc.stdout)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty: not an offloadlab run store"),
        (b"this is not a database at all" * 200, "is not a readable SQLite database"),
        (None, "another program's database"),
        ("truncated", "database disk image is malformed"),
    ],
    ids=["empty", "garbage", "foreign", "truncated"],
)
def test_broken_stores_give_one_line_and_are_not_written(tmp_path, world1, content, message):
    run_dir = tmp_path / "store"
    run_dir.mkdir()
    path = run_dir / DB_NAME
    if content is None:
        sqlite3.connect(path).execute("CREATE TABLE other (x)").connection.close()
    elif content == "truncated":
        whole = (world1 / DB_NAME).read_bytes()
        path.write_bytes(whole[: len(whole) // 3])
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    for verb in ("compare", "report"):
        proc = cli(verb, str(run_dir), check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert message in flat(proc.stdout) and "Traceback" not in proc.stdout + proc.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == [DB_NAME]


def test_reading_a_finished_store_creates_nothing_beside_it(world1, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(world1, copy)
    before = sorted(p.name for p in copy.iterdir())
    cli("compare", str(copy))
    assert sorted(p.name for p in copy.iterdir()) == before  # no -wal / -shm left by a reader


def test_text_from_the_store_is_never_read_as_markup(tmp_path):
    store = RunStore(tmp_path, create_schema=True)
    run_id = store.add_run("markup", "")
    strategy_id = store.add_strategy(run_id, "s", "fsdp2", {}, 1)
    store.set_strategy_status(strategy_id, "failed", "[rank0]: RuntimeError [/] [bold]boom")
    store.set_run_status(run_id, "done")
    store.close()
    proc = cli("compare", str(tmp_path))
    for literal in ("[rank0]:", "[/]", "[bold]boom"):  # as rich markup these would vanish or raise MarkupError
        assert literal in proc.stdout


@pytest.mark.slow
def test_a_run_folder_with_glob_characters_verifies_and_is_printed_whole(tmp_path):
    """DeepSpeed globs the checkpoint path: a folder named '[x]' failed its restore check."""
    spec = write_spec(tmp_path, [STRATEGIES[0]], steps=2)
    out = tmp_path / "runs [x]"
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "offloadlab.cli", "run", str(spec), "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "DS_ACCELERATOR": "cpu", "COLUMNS": "200", "TMPDIR": str(env_tmp)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"run store: {out}" in flat(proc.stdout)
    store = RunStore(out)
    (row,) = store.strategies(store.run()["id"])
    assert row["checkpoint_verified"] == 1, row["checkpoint_detail"]
    assert not list(env_tmp.glob("torchelastic_*"))  # torchrun's temp folders went into the run's, removed
    assert sorted(p.name for p in out.iterdir()) == sorted([DB_NAME, "logs", "spec.toml"])


@pytest.mark.slow
def test_out_naming_a_file_is_a_clear_error(tmp_path):
    spec = write_spec(tmp_path, [FSDP2])
    (tmp_path / "afile").write_text("mine")
    proc = cli("run", str(spec), "--out", str(tmp_path / "afile"), check=False)
    assert proc.returncode == 2 and "is a file: pass a folder" in flat(proc.stdout)
    assert (tmp_path / "afile").read_text() == "mine"


def test_without_cap_ipc_lock_root_is_held_to_ulimit_l(tmp_path, monkeypatch):
    """Docker's root has no CAP_IPC_LOCK and a 64 KiB-8 MiB memlock limit: the check was skipped for root and
    DeepSpeed's pinned allocation aborted the tune (SIGABRT)."""
    status = tmp_path / "status"
    status.write_text("CapEff:\t00000000a80425fb\n")  # Docker's default set: no bit 14
    assert not preflight.has_cap_ipc_lock(status)
    status.write_text("CapEff:\t000001ffffffffff\n")
    assert preflight.has_cap_ipc_lock(status)
    monkeypatch.setattr(preflight, "has_cap_ipc_lock", lambda: False)
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    limit = 8 << 20 if hard == resource.RLIM_INFINITY else min(8 << 20, hard)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, hard))
    try:
        with pytest.raises(preflight.PreflightError, match="ulimit -l is"):
            preflight.check_pinned_memory(64 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))


@pytest.mark.slow
def test_a_tune_stopped_mid_sweep_keeps_files_the_user_put_in_its_folder(tmp_path):
    """Ctrl-C used to remove the whole --out folder, files the user had put there during the tune with it."""
    out = tmp_path / "tune"
    proc = start_cli("tune", "--nvme", str(tmp_path), "--out", str(out))
    deadline = time.time() + 300
    while not (out / DB_NAME).exists():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
        time.sleep(0.2)
    (out / "notes.txt").write_text("mine")
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode in CTRL_C_EXIT, text
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert "the folder it made stays: it holds files the tune did not write" in flat(text)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("offloadlab-tune-")]


def _fill(path: Path) -> None:
    """Write until the drive is full: the run writes meanwhile, so a size measured first may not fit."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, bytes(chunk))
    finally:
        os.close(fd)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_disk_that_fills_ends_the_run_with_a_clear_message(tmp_path):
    """A drive that filled during a run crashed the CLI with a raw 'database or disk is full', the next
    strategy never ran and the store said 'running' for ever."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("this machine lets no tmpfs be mounted")
    try:
        spec = write_spec(tmp_path, [FSDP2, FSDP2 | {"name": "next"}], steps=5000, verify_checkpoint=False)
        run_dir = small / "run"
        proc = start_cli("run", str(spec), "--out", str(run_dir))
        wait_for_worker(proc, run_dir)
        filler = small / "a-users-file"
        _fill(filler)  # something else fills the drive
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 1, out
        assert "its store could not be written (database or disk is full)" in flat(out), out
        assert "Traceback" not in out
        filler.unlink()
        store = RunStore(run_dir)
        assert store.run_status() == "interrupted"
        summaries = {s.name: s for s in summarize(store)}
        assert summaries["next"].status == "failed"  # never started: the run ended at the full disk
        # "does not fit: disk full" when its rank could still write that, else shown as interrupted: never running
        assert summaries["fsdp2"].status in ("does_not_fit", "failed"), summaries["fsdp2"]
    finally:
        subprocess.run(["umount", "-l", str(small)])
