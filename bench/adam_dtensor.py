"""torch AdamW on the CPU over plain tensors against the same step over FSDP2's DTensor shards, side by side.

    python bench/adam_dtensor.py [--d-model 1024] [--layers 12]

With CPUOffloadPolicy the optimizer steps DTensors on the CPU; the planner's probe (offloadlab.measure.links)
steps one plain tensor. This prints how far apart the two rates are on this machine.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from offloadlab.measure.links import best_seconds


def stack(d_model: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(d_model, 4 * d_model) for _ in range(layers)])


def adamw_params_per_s(model: torch.nn.Module) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    return sum(p.numel() for p in model.parameters()) / best_seconds(optimizer.step, 3, cuda=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one rank, no port
    try:
        plain = adamw_params_per_s(stack(args.d_model, args.layers))
        sharded = stack(args.d_model, args.layers)
        mesh = init_device_mesh("cpu", (1,))
        for layer in sharded:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        on_dtensors = adamw_params_per_s(sharded)
    finally:
        dist.destroy_process_group()
    table = Table(title=f"torch AdamW on the CPU, {args.layers} x Linear({args.d_model}, {4 * args.d_model})")
    for col in ("parameters", "M params/s"):
        table.add_column(col, justify="left" if col == "parameters" else "right")
    table.add_row("plain tensors", f"{plain / 1e6:.0f}")
    table.add_row("FSDP2 DTensor shards", f"{on_dtensors / 1e6:.0f}")
    table.caption = f"DTensor / plain: {on_dtensors / plain:.2f}"
    Console().print(table)


if __name__ == "__main__":
    main()
