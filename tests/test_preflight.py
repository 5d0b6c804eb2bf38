"""Preflight: bad paths and sizes fail before any work, with the fix named, and leave nothing behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conftest import cli, write_spec
from offloadlab.preflight import PreflightError, check_build_lock, check_direct_io, check_directory, check_free_disk

NVME_STRATEGY = dict(name="z3", engine="deepspeed", zero_stage=3, offload_optimizer="nvme", offload_param="nvme",
                     buffer_size=1_000_000)


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


def test_run_rejects_a_swap_buffer_smaller_than_the_largest_parameter(tmp_path):
    spec = write_spec(tmp_path, [NVME_STRATEGY | {"buffer_size": 1000}], nvme_path=str(tmp_path))
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    # tiny: the largest parameter is the 256 x 64 embedding (and head).
    assert "buffer_size = 1,000 elements is smaller than the largest parameter (16,384 elements" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]


def test_run_rejects_tmpfs_nvme_path(tmp_path):
    spec = write_spec(tmp_path, [NVME_STRATEGY], nvme_path="/dev/shm")
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    assert "no O_DIRECT" in proc.stdout


def test_a_stale_jit_build_lock_is_named_instead_of_waited_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "async_io" / "lock"
    lock.parent.mkdir()
    lock.touch()
    check_build_lock("async_io")  # a build in progress holds a fresh lock: wait for it, as torch does
    hour_ago = time.time() - 3600
    os.utime(lock, (hour_ago, hour_ago))
    with pytest.raises(PreflightError, match=rf"{lock} is 60 minutes old: .* delete that file"):
        check_build_lock("async_io")
    assert lock.exists()  # named, never removed: a slow build elsewhere may still own it
