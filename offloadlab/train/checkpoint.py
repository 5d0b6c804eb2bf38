"""Atomic checkpoints and the check that a restore brings back exactly the saved state.

Layout under a strategy's checkpoint root:
    step-3/            the engine's files, plus digest.json (what the state was when saved)
    latest             the name of the newest complete step folder
    .tmp-step-5/       a save in progress; only renamed to step-5 once every rank has written
A crash mid-save leaves `latest` pointing at the last complete folder; the stale .tmp folder is removed by
the next save.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from offloadlab.engines.base import Engine

LATEST = "latest"
DIGEST_FILE = "digest.json"


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


def save_atomic(engine: Engine, root: Path, step: int) -> Path:
    """Save after `step` into root/step-N; collective over ranks. Returns the final folder."""
    rank = engine.ctx.rank
    tmp, final = root / f".tmp-step-{step}", root / f"step-{step}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-step-*"):
            shutil.rmtree(stale)
        tmp.mkdir()
    _barrier()
    engine.save(tmp, step)
    _barrier()
    digest = _gather_digest(engine.state_digest(scratch=tmp, saved=tmp))
    if rank == 0:
        _write_atomic(tmp / DIGEST_FILE, json.dumps({"step": step, "tensors": digest}, indent=0))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_atomic(root / LATEST, final.name)
    _barrier()
    return final


def latest_checkpoint(root: Path) -> Path:
    pointer = root / LATEST
    if not pointer.is_file():
        raise FileNotFoundError(f"no complete checkpoint under {root} (no '{LATEST}' file)")
    folder = root / pointer.read_text().strip()
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


def restore_and_check(engine: Engine, root: Path, scratch: Path) -> RestoreCheck:
    """Load the latest checkpoint into a freshly built engine and compare its state with the saved digest."""
    folder = latest_checkpoint(root)
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
    return RestoreCheck(step=step, saved_step=saved["step"], tensors_compared=len(expected), mismatched=mismatched)
