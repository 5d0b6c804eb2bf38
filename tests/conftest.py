"""Shared helpers: real runs of the real CLI in subprocesses, on the CPU (DeepSpeed's CPU accelerator, gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

REPO = Path(__file__).resolve().parents[1]

TINY = dict(seed=0, steps=4, seq_len=32, micro_batch=2, grad_accum=2, precision="fp32", model=dict(preset="tiny"))


def write_spec(folder: Path, strategies: list[dict], **overrides) -> Path:
    raw = {**TINY, "name": "t", **overrides, "strategy": strategies}
    path = folder / "spec.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


def cli(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "offloadlab.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"offloadlab {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def nvme_root(tmp_path_factory) -> Path:
    """A folder on the real disk (O_DIRECT works there), standing in for the user's NVMe mount."""
    return tmp_path_factory.mktemp("nvme")
