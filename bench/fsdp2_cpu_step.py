"""FSDP2's optimizer phase with the shards on the CPU, as the engine runs it, against the planner's probes.

    python bench/fsdp2_cpu_step.py [--d-model 1024] [--layers 12] [--repeats 7]

The phase is clipping over the gradients (one norm, one scaling) and then the optimizer's step: torch's
AdamW or DeepSpeed's CPU Adam over the shards (offloadlab.engines.fsdp2.adapter). Each is timed over plain
tensors and over FSDP2's DTensor shards of the same shapes, and, where there is a GPU, over plain tensors in
pinned memory, as CPUOffloadPolicy holds the shards and their gradients. The planner's probes
(offloadlab.measure.links) give the rates it predicts the phase from. On the H200 hosts the phase ran 2.0x
(DeepSpeed's Adam) and 1.4-1.7x (torch's) what the probes predict; on the CPU machine it does not: this
prints each rate beside the probe's, to find which of these the gap follows.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from offloadlab.engines.fsdp2.adapter import clip_local_shards, sharded_cpu_adam
from offloadlab.measure.links import (
    best_seconds,
    measure_adam_params_per_s,
    measure_host_passes_params_per_s,
)

ADAMW = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def stack(d_model: int, layers: int, pinned: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(d_model, 4 * d_model) for _ in range(layers)])
    for p in model.parameters():
        if pinned:
            p.data = p.data.pin_memory()
        p.grad = torch.full_like(p, 1e-3)
        if pinned:
            p.grad = p.grad.pin_memory()
    return model


def phase_rates(model: torch.nn.Module, optimizer: str, repeats: int) -> tuple[float, float]:
    """(clipping, optimizer step) in parameters per second, the best of `repeats`."""
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    step = sharded_cpu_adam(params, **ADAMW) if optimizer == "deepspeed" else torch.optim.AdamW(params, **ADAMW)
    clip = best_seconds(lambda: clip_local_shards(params, 1.0), repeats, cuda=False)
    return n / clip, n / best_seconds(step.step, repeats, cuda=False)  # its untimed call makes the moments


def sharded(d_model: int, layers: int) -> torch.nn.Module:
    model = stack(d_model, layers)
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)  # a DTensor like its parameter
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=7, help="timed calls of each; the best counts")
    args = parser.parse_args()
    d, n_layers, repeats = args.d_model, args.layers, args.repeats
    probes = {
        "torch": measure_adam_params_per_s("torch", repeats=repeats),
        "deepspeed": measure_adam_params_per_s("deepspeed-cpu", repeats=repeats),
    }
    host_pass = measure_host_passes_params_per_s(repeats=repeats)
    layouts = {"plain tensors": lambda: stack(d, n_layers), "FSDP2 shards": lambda: sharded(d, n_layers)}
    if torch.cuda.is_available():
        layouts["plain tensors, pinned"] = lambda: stack(d, n_layers, pinned=True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one rank, no port
    try:
        rows = [(name, opt, *phase_rates(build(), opt, repeats)) for name, build in layouts.items() for opt in probes]
    finally:
        dist.destroy_process_group()
    table = Table(title=f"FSDP2's CPU optimizer phase, {n_layers} x Linear({d}, {4 * d}), M params/s")
    for col in ("memory", "optimizer", "clipping", "step", "phase / planned"):
        table.add_column(col, justify="left" if col in ("memory", "optimizer") else "right")
    rows = [("planner's probes", opt, host_pass, rate) for opt, rate in probes.items()] + rows
    for name, opt, clip, step in rows:
        slower = (1 / clip + 1 / step) / (1 / host_pass + 1 / probes[opt])
        table.add_row(name, opt, f"{clip / 1e6:.0f}", f"{step / 1e6:.0f}", f"{slower:.2f}")
    table.caption = "phase: clipping then the step, in seconds a parameter; > 1: slower than the planner predicts"
    Console().print(table)


if __name__ == "__main__":
    main()
