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
    strategy = next(s for s in spec.strategy if s.name == name)
    model = "model.to(torch.bfloat16), then " if strategy.bf16_master_weights else ""
    optimizer = "torchao.optim.CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, fused=True)"
    on_gpu = f"# ratio {strategy.ratio:g}: the first {1 - strategy.ratio:.0%} of the parameters in a GPU AdamW"
    kept = [on_gpu] if strategy.ratio < 1 else []
    return [
        f"# The optimizer: {model}{optimizer}",
        *kept,
        "distributed_type: 'NO'",
        f"mixed_precision: {'bf16' if spec.precision == 'bf16' else 'no'}",
    ]
