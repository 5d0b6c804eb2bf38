"""torchao's side of what offloadlab writes for users' own scripts: an Accelerate config for one GPU (the
optimizer is made in the script: `torchao.optim.CPUOffloadOptimizer(model.parameters(), ...)`). No torch."""

from __future__ import annotations

from pathlib import Path

from offloadlab.spec import RunSpec


def file_names(name: str) -> list[str]:
    """None: the optimizer is one line of the user's script."""
    return []


def export(spec: RunSpec, out_dir: Path, name: str) -> list[str]:
    """The lines of the Accelerate config: one process, bf16 autocast where the run is bf16; the optimizer
    is the script's own, said in a comment."""
    return [
        "# The optimizer: torchao.optim.CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, fused=True)",
        "distributed_type: 'NO'",
        f"mixed_precision: {'bf16' if spec.precision == 'bf16' else 'no'}",
    ]
