"""Atomic checkpoints: a save that dies midway leaves the previous one complete and loadable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from offloadlab.checkpoint import latest_checkpoint, restore_and_check, save_atomic
from offloadlab.engines.base import DistContext, Engine, digest_tree


class TensorEngine(Engine):
    """The smallest engine over the interface: one tensor saved with torch.save. It tests the checkpoint
    protocol (tmp folder, rename, latest pointer, digests), not an engine; the engines have end-to-end tests."""

    def __init__(self, value: float, fail_mid_save: bool = False):
        super().__init__(DistContext(0, 1, 0, torch.device("cpu")))
        self.weight = torch.full((4,), value)
        self.fail_mid_save = fail_mid_save

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


def test_a_crash_mid_save_keeps_the_last_good_checkpoint(tmp_path):
    save_atomic(TensorEngine(1.0), tmp_path, step=2)
    with pytest.raises(RuntimeError, match="disk pulled"):
        save_atomic(TensorEngine(5.0, fail_mid_save=True), tmp_path, step=4)
    assert latest_checkpoint(tmp_path).name == "step-2"
    restored = TensorEngine(0.0)
    check = restore_and_check(restored, tmp_path, scratch=tmp_path / "scratch")
    assert check.ok and check.step == 2
    assert torch.equal(restored.weight, torch.full((4,), 1.0))
    # The next save clears the dead one's leftovers.
    save_atomic(TensorEngine(3.0), tmp_path, step=6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-2", "step-6"]


def test_a_restore_that_differs_is_reported(tmp_path):
    save_atomic(TensorEngine(1.0), tmp_path, step=2)

    class Drifting(TensorEngine):
        def load(self, folder):
            step = super().load(folder)
            self.weight = self.weight + 1e-6
            return step

    check = restore_and_check(Drifting(0.0), tmp_path, scratch=tmp_path / "scratch")
    assert not check.ok
    assert check.mismatched == ["w/weight"]


def test_no_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        latest_checkpoint(tmp_path)
