"""Atomic checkpoints and the check that a restore brings back exactly the saved state.

Layout under a strategy's checkpoint root:
    step-3/            the engine's files, plus digest.json (what the state was when saved)
    latest             the name of the newest complete step folder
    .tmp-step-5/       a save in progress; only renamed to step-5 once every rank has written
A crash mid-save leaves `latest` pointing at the last complete folder; the stale .tmp folder is removed by
the next save.

DeepSpeed's loader unpickles with weights_only=False and torch.distributed.checkpoint unpickles .metadata,
so a file replaced between the save and the restore would run its code. The size and sha256 of every file a
save wrote go to the run store, and a restore loads nothing unless the folder holds exactly those files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from offloadlab.engines.base import Engine

LATEST = "latest"
DIGEST_FILE = "digest.json"
RNG_FILE = "rng-rank{rank}.pt"
"""Each rank's random number generators when it saved: dropout (GPT-2's 0.1 in every block) draws from them,
so a resumed step equals the uninterrupted one only with them restored. Neither engine saves them."""

FileDigests = dict[str, tuple[int, str]]
"""{path relative to the step folder: (size in bytes, sha256)}"""


class CheckpointRefused(Exception):
    """The checkpoint folder is not what the run saved: nothing in it was loaded."""


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _gather_digest(local: dict[str, str]) -> dict[str, str]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    parts: list[dict[str, str]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(parts, local)
    return {k: v for part in parts for k, v in part.items()}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def file_digests(folder: Path) -> FileDigests:
    """Size and sha256 of every file under folder; anything but folders and regular files (a link, a
    fifo) is an error, since a loader would follow it."""
    out: FileDigests = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                continue
            rel = str(path.relative_to(folder))
            if not stat.S_ISREG(mode):
                raise CheckpointRefused(f"{rel} is not a regular file")
            with open(path, "rb") as f:
                out[rel] = (os.fstat(f.fileno()).st_size, hashlib.file_digest(f, "sha256").hexdigest())
    return out


def _differences(folder: Path, saved: FileDigests) -> str | None:
    """What differs between the folder and what the save recorded, or None."""
    if not saved:
        return "the run store records no files for it (saved by another process, or its record was lost)"
    try:
        found = file_digests(folder)
    except (CheckpointRefused, OSError) as err:
        return str(err)
    added = sorted(found.keys() - saved.keys())
    missing = sorted(saved.keys() - found.keys())
    changed = sorted(k for k in found.keys() & saved.keys() if found[k] != saved[k])
    named = {"added": added, "missing": missing, "changed since the save": changed}
    return "; ".join(f"{what} {', '.join(paths[:3])}" for what, paths in named.items() if paths) or None


def _agreed(problem: str | None) -> str | None:
    """Rank 0's verdict, on every rank (rank 0 alone reads the files: they are one host's)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return problem
    box = [problem]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_atomic(
    engine: Engine, root: Path, step: int, record_files: Callable[[str, FileDigests], None] | None = None
) -> Path:
    """Save after `step` into root/step-N; collective over ranks. Returns the final folder. Rank 0 hands
    `record_files` the folder's name and its files before the folder becomes `latest`."""
    rank = engine.ctx.rank
    tmp, final = root / f".tmp-step-{step}", root / f"step-{step}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-step-*"):
            shutil.rmtree(stale)
        tmp.mkdir()
    _barrier()
    engine.save(tmp, step)
    _save_rng(tmp / RNG_FILE.format(rank=rank))
    _barrier()
    digest = _gather_digest(engine.state_digest(scratch=tmp, saved=tmp))
    if rank == 0:
        _write_atomic(tmp / DIGEST_FILE, json.dumps({"step": step, "tensors": digest}, indent=0))
        _fsync_tree(tmp)
        if record_files is not None:
            record_files(final.name, file_digests(tmp))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_atomic(root / LATEST, final.name)
    _barrier()
    return final


def _save_rng(path: Path) -> None:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    torch.save({"cpu": torch.get_rng_state(), "cuda": cuda}, path)


def _restore_rng(path: Path) -> None:
    """A checkpoint saved before the generators were (an older run's) restores none."""
    if not path.is_file():
        return
    state = torch.load(path, weights_only=True)  # tensors only; the file's digest was checked too
    torch.set_rng_state(state["cpu"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def latest_checkpoint(root: Path) -> Path:
    pointer = root / LATEST
    if not pointer.is_file():
        raise FileNotFoundError(f"no complete checkpoint under {root} (no '{LATEST}' file)")
    folder = root / pointer.read_text().strip()
    if folder.parent.resolve() != root.resolve():
        raise CheckpointRefused(f"{pointer} points outside {root}")
    if not (folder / DIGEST_FILE).is_file():
        raise FileNotFoundError(f"checkpoint {folder} is incomplete: {DIGEST_FILE} missing")
    return folder


@dataclass(frozen=True)
class RestoreCheck:
    step: int
    saved_step: int
    tensors_compared: int
    mismatched: list[str]

    @property
    def ok(self) -> bool:
        return not self.mismatched and self.step == self.saved_step


def restore_and_check(
    engine: Engine, root: Path, scratch: Path, saved_files: Callable[[str], FileDigests]
) -> RestoreCheck:
    """Load the latest checkpoint into a freshly built engine and compare its state with the saved digest;
    `saved_files(folder name)` is what the save recorded, checked before any file is read."""
    folder = latest_checkpoint(root)
    problem = _agreed(_differences(folder, saved_files(folder.name)) if engine.ctx.rank == 0 else None)
    if problem is not None:
        raise CheckpointRefused(f"checkpoint {folder} was not loaded: {problem}")
    saved = json.loads((folder / DIGEST_FILE).read_text())
    step = engine.load(folder)
    if engine.ctx.rank == 0:
        scratch.mkdir(parents=True, exist_ok=True)
    _barrier()
    try:
        live = _gather_digest(engine.state_digest(scratch=scratch, saved=None))
    finally:
        _barrier()
        if engine.ctx.rank == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    expected: dict[str, str] = saved["tensors"]
    mismatched = sorted(k for k in expected.keys() | live.keys() if expected.get(k) != live.get(k))
    _restore_rng(folder / RNG_FILE.format(rank=engine.ctx.rank))  # last: the next step draws as the saved run's did
    return RestoreCheck(step=step, saved_step=saved["step"], tensors_compared=len(expected), mismatched=mismatched)
