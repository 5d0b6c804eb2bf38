"""Atomic checkpoints: a save that dies midway leaves the previous one complete and loadable; the restore
check's digests cost no second copy of the state in RAM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, write_spec
from offloadlab.engines.base import Engine
from offloadlab.engines.digests import digest_tree
from offloadlab.engines.dist import DistContext
from offloadlab.train.checkpoint import CheckpointRefused, latest_checkpoint, restore_and_check, save_atomic


class TensorEngine(Engine):
    """The smallest engine over the interface: one tensor saved with torch.save. It tests the checkpoint
    protocol (tmp folder, rename, latest pointer, digests), not an engine; the engines have end-to-end tests."""

    def __init__(self, value: float, fail_mid_save: bool = False):
        super().__init__(DistContext(0, 1, 0, torch.device("cpu")))
        self.weight = torch.full((4,), value)
        self.fail_mid_save = fail_mid_save

    @classmethod
    def build(cls, spec, strategy, ctx, nvme_dir):
        raise NotImplementedError

    @classmethod
    def checkpoint_bytes(cls, strategy, n_params, param_bytes):
        raise NotImplementedError

    @property
    def module(self):
        raise NotImplementedError

    def train_step(self, batches):
        raise NotImplementedError

    def save(self, folder: Path, step: int) -> None:
        torch.save({"weight": self.weight, "step": step}, folder / "part0.pt")
        if self.fail_mid_save:
            raise RuntimeError("disk pulled mid-save")
        torch.save({"weight": self.weight * 2}, folder / "part1.pt")

    def load(self, folder: Path) -> int:
        state = torch.load(folder / "part0.pt")
        self.weight = state["weight"]
        return state["step"]

    def state_digest(self, scratch, saved):
        return digest_tree({"weight": self.weight}, "w", {})


class Recorded(dict):
    """What the run store keeps of each save's files, by step folder."""

    def record(self, folder: str, files: dict) -> None:
        self[folder] = files

    def files(self, folder: str) -> dict:
        return self.get(folder, {})


def test_a_crash_mid_save_keeps_the_last_good_checkpoint(tmp_path):
    recorded = Recorded()
    save_atomic(TensorEngine(1.0), tmp_path, step=2, record_files=recorded.record)
    with pytest.raises(RuntimeError, match="disk pulled"):
        save_atomic(TensorEngine(5.0, fail_mid_save=True), tmp_path, step=4, record_files=recorded.record)
    assert latest_checkpoint(tmp_path).name == "step-2" and list(recorded) == ["step-2"]
    restored = TensorEngine(0.0)
    check = restore_and_check(restored, tmp_path, scratch=tmp_path / "scratch", saved_files=recorded.files)
    assert check.ok and check.step == 2
    assert torch.equal(restored.weight, torch.full((4,), 1.0))
    # The next save clears the dead one's leftovers.
    save_atomic(TensorEngine(3.0), tmp_path, step=6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-2", "step-6"]


class NeverLoads(TensorEngine):
    def load(self, folder):
        raise AssertionError("a file of the refused checkpoint was read")


@pytest.mark.parametrize(
    "tamper, said",
    [
        (
            lambda step: torch.save({"weight": torch.zeros(4), "step": 2}, step / "part0.pt"),
            "changed since the save part0.pt",
        ),
        (lambda step: (step / "extra.pt").write_bytes(b"planted"), "added extra.pt"),
        (lambda step: (step / "part1.pt").unlink(), "missing part1.pt"),
        (
            lambda step: ((step / "part1.pt").unlink(), (step / "part1.pt").symlink_to("/etc/passwd")),
            "not a regular file",
        ),
    ],
)
def test_a_checkpoint_changed_after_its_save_is_not_loaded(tmp_path, tamper, said):
    recorded = Recorded()
    save_atomic(TensorEngine(1.0), tmp_path, step=2, record_files=recorded.record)
    tamper(tmp_path / "step-2")
    with pytest.raises(CheckpointRefused, match=said):
        restore_and_check(NeverLoads(0.0), tmp_path, scratch=tmp_path / "scratch", saved_files=recorded.files)


def test_a_checkpoint_the_store_has_no_record_of_is_not_loaded(tmp_path):
    save_atomic(TensorEngine(1.0), tmp_path, step=2)
    with pytest.raises(CheckpointRefused, match="records no files"):
        restore_and_check(NeverLoads(0.0), tmp_path, scratch=tmp_path / "scratch", saved_files=Recorded().files)
    (tmp_path / "latest").write_text("../elsewhere")
    with pytest.raises(CheckpointRefused, match="points outside"):
        latest_checkpoint(tmp_path)


def test_a_restore_that_differs_is_reported(tmp_path):
    recorded = Recorded()
    save_atomic(TensorEngine(1.0), tmp_path, step=2, record_files=recorded.record)

    class Drifting(TensorEngine):
        def load(self, folder):
            step = super().load(folder)
            self.weight = self.weight + 1e-6
            return step

    check = restore_and_check(Drifting(0.0), tmp_path, scratch=tmp_path / "scratch", saved_files=recorded.files)
    assert not check.ok
    assert check.mismatched == ["w/weight"]


def test_no_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        latest_checkpoint(tmp_path)


# One real training step, one real save, then the digest the restore check compares, with the process's
# peak resident set reset in between (Linux: clear_refs 5), so the peak counts the digest alone.
DIGEST_PEAK_SCRIPT = """
import json, sys
from pathlib import Path
from offloadlab.workload.data import TokenSource
from offloadlab.engines.base import build_engine
from offloadlab.engines.dist import DistContext
from offloadlab.engines.dist import end_rank
from offloadlab.spec import load_spec
from offloadlab.workload.model import vocab_size

def status_bytes(key):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key))
    return int(line.split()[1]) * 1024

spec = load_spec(Path(sys.argv[1]))
ctx = DistContext.from_env()
engine = build_engine(spec, spec.strategy[0], ctx, None)
source = TokenSource(spec.data, vocab_size(spec.model, spec.seq_len), spec.seq_len, spec.seed)
engine.train_step(source.micro_batches(0, ctx.rank, ctx.world_size, spec.micro_batch, spec.grad_accum))
folder = Path(sys.argv[2])
folder.mkdir(exist_ok=True)
engine.save(folder, 1)
Path("/proc/self/clear_refs").write_text("5")
before = status_bytes("VmRSS:")
digest = engine.state_digest(scratch=folder.parent / "scratch", saved=folder)
if ctx.rank == 0:
    print(json.dumps({"digest_peak_bytes": status_bytes("VmHWM:") - before, "tensors": len(digest),
                      "params": sum(p.numel() for p in engine.module.parameters())}))
engine.close()
end_rank(0)  # as the run's workers end: see end_rank
"""


@pytest.mark.parametrize(
    "strategy, nproc",
    [
        # at one rank on the CPU the full tensor is the local shard itself; two ranks make the gather copy
        (dict(name="fsdp2-cpu-offload", engine="fsdp2", cpu_offload=True), 2),
        (dict(name="zero2-cpu", engine="deepspeed", zero_stage=2, offload_optimizer="cpu"), 1),
    ],
)
@pytest.mark.slow
def test_the_restore_check_digests_state_without_a_second_copy_in_ram(tmp_path, strategy, nproc):
    """At 1.42B a full copy of the fp32 state (FSDP2's full_state_dict, or torch.load of DeepSpeed's
    optimizer file) added 17 GiB to the run's host peak. The digest now gathers or maps one tensor (or
    16 MiB of one) at a time: rank 0's peak stays a small part of the state (~350 MB here)."""
    spec = write_spec(
        tmp_path, [strategy], nproc=nproc, model=dict(d_model=512, n_layers=8, n_heads=8, vocab_size=4096)
    )
    script = tmp_path / "digest_peak.py"
    script.write_text(DIGEST_PEAK_SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(script),
            str(spec),
            str(tmp_path / "ckpt"),
        ],
        cwd=REPO,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    state_bytes = 12 * result["params"]  # fp32 weights and both Adam moments, all ranks together
    assert result["tensors"] > 3 * 8 * 2  # the moments of every block's weights were digested
    assert result["digest_peak_bytes"] < 0.1 * state_bytes, result
