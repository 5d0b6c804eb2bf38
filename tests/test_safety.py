"""Safety: nothing outside the tool's own folders is touched, no code from the current folder runs, no run is
orphaned or corrupted. Each case was reproduced against the tool before it was fixed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
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
from offloadlab.results.figures import LAUNCH_EVENT, LAUNCH_TOKEN_ENV
from offloadlab.results.rundir import RunDir, RunDirError
from offloadlab.results.status import Status
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


def _digests(folder: Path) -> dict[str, str]:
    """Each file under `folder` by its content's hash (a link by its target): what "nothing changed" compares."""

    def digest(path: Path) -> str:
        return os.readlink(path) if path.is_symlink() else hashlib.sha256(path.read_bytes()).hexdigest()

    return {str(path.relative_to(folder)): digest(path) for path in folder.rglob("*") if not path.is_dir()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["../..", "a/b", ".hidden", "x y"])
def test_unsafe_strategy_names_are_refused_before_anything_is_made(tmp_path, name):
    """A strategy named '../..' used to delete the run folder's parent (an earlier run's folder with it)."""
    earlier = tmp_path / "earlier-run"
    earlier.mkdir()
    (earlier / "keep.txt").write_text("an earlier run")
    spec = write_spec(tmp_path, [FSDP2 | {"name": name}])
    proc = cli("run", str(spec), "--out", str(tmp_path / "runs" / "r1"), check=False)
    assert proc.returncode == 2 and "is not a usable name" in flat(proc.stderr), proc.stdout + proc.stderr
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
    from offloadlab.engines.deepspeed.adapter import digest_checkpoint_files

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
        again = _verify_as_the_run_would(run_dir, name, verify.split(), env)
        assert again.returncode != 0
        assert not marker.exists(), f"{name}: the planted {planted.name} was unpickled"
        store = RunStore(run_dir)
        row = store.strategy(store.strategy_id(store.run()["id"], name))
        store.close()
        assert not row["checkpoint_verified"]
        assert f"was not loaded: changed since the save {planted.relative_to(step)}" in row["checkpoint_detail"]


def _verify_as_the_run_would(run_dir: Path, name: str, command: list[str], env: dict) -> subprocess.CompletedProcess:
    """The verify step as `offloadlab run` starts it: the run folder held, the strategy running and the
    launch's token recorded and handed over (a worker refuses to record into a run not running it)."""
    held = RunDir(run_dir).lock()
    try:
        store = RunStore(run_dir, writable=True)
        strategy_id = store.strategy_id(store.run()["id"], name)
        store.set_strategy_status(strategy_id, Status.RUNNING)
        store.add_events(strategy_id, 0, [(None, LAUNCH_EVENT, time.time(), None, "a-test-launch")])
        store.close()
        env = {**env, LAUNCH_TOKEN_ENV: "a-test-launch"}
        return subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True, timeout=600)
    finally:
        os.close(held)


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
    listed = cli("compare", str(tmp_path / "runs")).stdout
    # The strategy the dead run stopped is stored as failed ("interrupted: ..."), but it did not finish.
    assert re.search(r"\br1\b.*interrupted.*\b0/1\b", listed) and re.search(r"\br2\b.*\b1/1\b", listed), listed


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
        before = {root: _digests(root) for root in (tmp_path / "victim", *beside)}
        trained_before = _steps_trained(runs / "A")

        spec = write_spec(tmp_path, [FSDP2], steps=1, verify_checkpoint=False)
        later = cli("run", str(spec), "--out", str(runs / "B"))
        assert "marked" not in later.stdout, later.stdout
        cli("compare", str(runs / "B"))  # reads its siblings for a stored baseline

        assert {root: _digests(root) for root in (tmp_path / "victim", *beside)} == before
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
    assert tune.returncode == 2 and "holds a run store already" in flat(tune.stderr)


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
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the plan says no strategy of this spec fits this machine (z3 needs host RAM" in flat(proc.stderr)
    assert "--force runs it anyway" in flat(proc.stderr)
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
        assert message in flat(proc.stderr) and "Traceback" not in proc.stdout + proc.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == [DB_NAME]


def test_a_folder_of_runs_is_answered_with_the_runs_in_it(tmp_path, world1):
    """`compare runs/` (the default --out's parent) said "not an offloadlab run directory": it lists them,
    newest first, an unreadable one with why; `report` names them."""
    runs = tmp_path / "runs"
    for name in ("older", "newer"):
        shutil.copytree(world1, runs / name)
        os.utime(runs / name / DB_NAME, (1e9, 1e9) if name == "older" else None)
    (runs / "junk").mkdir()
    (runs / "junk" / DB_NAME).write_bytes(b"not sqlite" * 100)
    os.utime(runs / "junk" / DB_NAME, (1e8, 1e8))
    listed = json.loads(cli("compare", str(runs), "--json").stdout)
    assert [(r["path"], r["status"], r["strategies_done"]) for r in listed[:2]] == [
        (str(runs / "newer"), "done", 4),
        (str(runs / "older"), "done", 4),
    ]
    assert listed[2]["status"].startswith("unreadable: ") and listed[2]["strategies_total"] == 0
    assert "3 runs in" in cli("compare", str(runs)).stdout
    proc = cli("report", str(runs), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{runs} is a folder of 3 runs (newer, older, junk): pass one, e.g. {runs / 'newer'}" in flat(proc.stderr)
    assert sorted(p.name for p in runs.iterdir()) == ["junk", "newer", "older"]


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
    assert proc.returncode == 2 and "is a file: pass a folder" in flat(proc.stderr)
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


@contextlib.contextmanager
def _mounted(folder: Path, *mount: str):
    """`mount *mount folder` for the test's length (root only; skipped where this machine allows none)."""
    folder.mkdir(exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", *mount, str(folder)], capture_output=True).returncode != 0:
        pytest.skip(f"this machine lets no {' '.join(mount)} be mounted here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)])


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
def test_a_disk_that_fills_ends_the_run_with_a_clear_message(tmp_path):
    """A drive that filled during a run crashed the CLI with a raw 'database or disk is full', the next
    strategy never ran and the store said 'running' for ever; then, with no room left for the store's last
    writes, the run read as "a closed terminal, or killed": a reserve the run holds is freed for them."""
    spec = write_spec(tmp_path, [FSDP2, FSDP2 | {"name": "next"}], steps=5000, verify_checkpoint=False)
    with _mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=32m", "tmpfs") as small:
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
        assert summaries["fsdp2"].status in ("does_not_fit", "failed"), summaries["fsdp2"]
        assert "disk" in summaries["fsdp2"].reason and "killed" not in summaries["fsdp2"].reason
        assert sorted(p.name for p in run_dir.iterdir()) == sorted([DB_NAME, "logs", "spec.toml"])


# Bad input: one line on stderr, a specific exit code


def _one_line_error(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The CLI exited `code` and said why in exactly one line on stderr, naming `words`; no traceback."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), proc.stderr
    assert all(word in lines[0] for word in words), lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


@pytest.fixture
def read_only(tmp_path) -> Path:
    """A folder nothing can be written into: a read-only tmpfs (permission bits do not stop root)."""
    with _mounted(tmp_path / "read-only", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs") as folder:
        yield folder


def test_loading_a_spec_grows_linearly_with_its_strategies(tmp_path):
    """Checking the names' uniqueness was quadratic: 30,000 strategies took 11.4 s, 100x the time of 3,000.
    A ratio of the two, not a time: CI's CPU speed differs from this machine's (an absolute second failed)."""
    from offloadlab.spec import load_spec

    def cpu_seconds(count: int) -> float:
        folder = tmp_path / str(count)
        folder.mkdir()
        spec = write_spec(folder, [FSDP2 | {"name": f"s{i}"} for i in range(count)])
        seconds = []
        for _ in range(2):  # CPU time, the less of two: other processes on a busy machine do not count
            start = time.process_time()
            assert len(load_spec(spec).strategy) == count
            seconds.append(time.process_time() - start)
        return min(seconds)

    ratio = cpu_seconds(30_000) / cpu_seconds(3_000)
    assert ratio < 25, f"10x the strategies took {ratio:.0f}x the time: linear is about 10, quadratic 100"


def test_numbers_are_checked_at_spec_load_and_named_on_one_line(tmp_path):
    """`lr = inf` and `seed = 10**23` failed inside the strategy (a NULL loss in the store), `steps = true`
    ran one step."""
    spec = write_spec(
        tmp_path,
        [FSDP2 | {"pin_memory": 1}],
        lr=float("inf"),
        weight_decay=float("nan"),
        seed=10**23,
        steps=True,
    )
    line = _one_line_error(cli("run", str(spec), "--out", str(tmp_path / "run"), check=False), 2)
    for said in (
        "lr: Input should be a finite number, not inf",
        "weight_decay: Input should be a finite number, not nan",
        "seed: Input should be less than 4294967296, not 100000000000000000000000",
        "steps: Input should be a valid integer, not true",
        "strategy.0.pin_memory: Input should be a valid boolean, not 1",
    ):
        assert said in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "content, said",
    [
        (b'name = "caf\xe9"\n', "is not UTF-8 text (byte 11)"),
        (b"x = " + b"[" * 200_000 + b"]" * 200_000 + b"\n", "nests arrays or tables too deeply to read"),
    ],
    ids=["invalid-utf8", "nested-200k-deep"],
)
def test_an_unreadable_spec_file_is_named_on_one_line(tmp_path, content, said):
    spec = tmp_path / "spec.toml"
    spec.write_bytes(content)
    _one_line_error(cli("run", str(spec), "--out", str(tmp_path / "run"), check=False), 2, str(spec), said)


def test_init_overwrites_only_with_force_and_never_through_a_link_out(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "tiny_cpu.toml").write_text("# the user's own")
    proc = cli("init", str(folder), check=False)
    _one_line_error(proc, 2, "already holds tiny_cpu.toml", "--force", "nothing was written")
    assert [p.name for p in folder.iterdir()] == ["tiny_cpu.toml"]
    assert (folder / "tiny_cpu.toml").read_text() == "# the user's own"
    cli("init", str(folder), "--force")
    assert (folder / "tiny_cpu.toml").read_text() == (REPO / "configs" / "tiny_cpu.toml").read_text()

    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "tiny_cpu.toml").symlink_to(tmp_path / "outside.toml")  # dangling: the write would create it
    proc = cli("init", str(linked), "--force", check=False)
    _one_line_error(proc, 2, f"{linked / 'tiny_cpu.toml'} -> {tmp_path / 'outside.toml'}", "never written through")
    assert not (tmp_path / "outside.toml").exists() and [p.name for p in linked.iterdir()] == ["tiny_cpu.toml"]


def test_plan_write_refuses_to_overwrite_the_users_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "zero1.toml").write_text("# the user's own")
    (out / "zero1_accelerate.yaml").write_text("mine: too\n")
    before = _digests(out)
    proc = cli("plan", "--model", "tiny", "--gpu-mem", "0", "--strategy", "zero1", "--write", str(out), check=False)
    _one_line_error(proc, 2, "already holds zero1.toml, zero1_accelerate.yaml", "--force")
    assert _digests(out) == before


def test_tune_out_refuses_fragments_already_there_before_measuring(tmp_path):
    """Files an earlier tune wrote are the user's once it has ended: they are refused like the user's own."""
    out = tmp_path / "tune"
    out.mkdir()
    (out / "tuned.toml").write_text("# an earlier tune's, edited since")
    before = _digests(out)
    proc = cli("tune", "--nvme", str(tmp_path), "--quick", "--out", str(out), check=False)
    _one_line_error(proc, 2, "already holds tuned.toml", "--force")
    assert _digests(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("offloadlab-tune-")]  # nothing measured


def _tiny_store(run_dir: Path) -> Path:
    run_dir.mkdir()
    store = RunStore(run_dir, create_schema=True)
    store.set_run_status(store.add_run("tiny", ""), "done")
    store.close()
    return run_dir


@pytest.mark.parametrize(
    "args, said",
    [
        (("report", "{store}", "--out", "{ro}/report.html"), "report {ro}/report.html cannot be written"),
        (("report", "{store}", "--out", "{store}"), "report {store} is a folder: pass the path of the file"),
        (("plan", "--model", "tiny", "--write", "{store}/{db}"), "--write {store}/{db} is a file: pass a folder"),
        (("init", "/proc/sys/offloadlab"), "init folder /proc/sys/offloadlab cannot be written: /proc/sys"),
        (("run", "{spec}", "--out", "{ro}/run"), "run folder (--out) {ro}/run cannot be written"),
        (("tune", "--nvme", "{tmp}", "--quick", "--out", "{ro}/tune"), "--out {ro}/tune cannot be written"),
    ],
    ids=["report-read-only", "report-out-folder", "plan-write-file", "init-proc-sys", "run-read-only", "tune-ro"],
)
def test_a_place_that_cannot_be_written_is_named_before_any_work(tmp_path, read_only, args, said):
    spec = write_spec(tmp_path, [FSDP2])
    places = dict(store=_tiny_store(tmp_path / "store"), db=DB_NAME, ro=read_only, spec=spec, tmp=tmp_path)
    before = _digests(tmp_path)
    proc = cli(*(arg.format(**places) for arg in args), check=False)
    _one_line_error(proc, 2, said.format(**places))
    assert _digests(tmp_path) == before


@pytest.mark.parametrize("state", ["missing", "read-only"])
def test_torch_extensions_dir_that_cannot_hold_the_ops_is_named(tmp_path, read_only, monkeypatch, state):
    folder = tmp_path / "missing" if state == "missing" else read_only
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(folder))
    spec = write_spec(tmp_path, [FSDP2])
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    said = "is not a folder" if state == "missing" else "cannot be written"
    _one_line_error(proc, 2, f"TORCH_EXTENSIONS_DIR {folder} {said}")
    assert not folder.exists() or not any(folder.iterdir())
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "hosts, said",
    [
        (("--nnodes", "2", "--node-rank", "5"), "--node-rank 5 is not a rank of --nnodes 2"),
        (("--nnodes", "0"), "--nnodes 0: at least this host takes part"),
    ],
    ids=["rank-past-the-hosts", "no-hosts"],
)
def test_hosts_that_cannot_meet_are_refused_before_any_wait(tmp_path, hosts, said):
    spec = write_spec(tmp_path, [FSDP2])
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), *hosts, timeout=120, check=False)
    _one_line_error(proc, 2, said)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_missing_host_ends_the_run_after_the_rendezvous_timeout(tmp_path):
    """`--nnodes 2` with no second host waited silently for ever."""
    spec = write_spec(tmp_path, [FSDP2, FSDP2 | {"name": "second"}], steps=2, verify_checkpoint=False)
    start = time.monotonic()
    proc = cli(
        "run", str(spec), "--out", str(tmp_path / "run"), "--nnodes", "2", "--master-port", "29531",
        "--rdzv-timeout", "5", timeout=180, check=False,
    )  # fmt: skip
    _one_line_error(proc, 1, "did not meet at --master-addr 127.0.0.1:29531 within --rdzv-timeout 5 s")
    assert time.monotonic() - start < 120
    assert RunStore(tmp_path / "run").run_status() == "interrupted"  # the second strategy never waited too


def test_a_full_drive_under_tune_is_called_full(tmp_path):
    """A full ext4 was called 'does not support O_DIRECT (No space left on device)'."""
    image = tmp_path / "drive.img"
    with open(image, "wb") as f:
        f.truncate(8 << 20)
    if subprocess.run(["mkfs.ext4", "-q", str(image)], capture_output=True).returncode != 0:
        pytest.skip("this machine has no mkfs.ext4")
    with _mounted(tmp_path / "drive", "-o", "loop", str(image)) as drive:
        _fill(drive / "a-users-file")
        proc = cli("tune", "--nvme", str(drive), "--quick", "--out", str(tmp_path / "tune"), check=False)
        _one_line_error(proc, 2, f"--nvme {drive} is full (ENOSPC", "GiB needed")
        assert sorted(p.name for p in drive.iterdir()) == ["a-users-file", "lost+found"]
        assert not (tmp_path / "tune").exists()


def test_plan_leaves_no_torch_cache_folder_in_tmpdir(tmp_path, monkeypatch):
    """The first optimizer plan builds imports dynamo, which made an empty TMPDIR/torchinductor_USER."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cli("plan", "--model", "tiny", "--gpu-mem", "0", "--host-mem", "8")
    assert list(tmp.iterdir()) == []
