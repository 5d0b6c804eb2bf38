"""What is on the GPU at a strategy's peak, by the code that allocated it (issue 19: the planner's GPU
peak for DeepSpeed on Hugging Face models).

    python bench/gpu_peak_attribution.py SPEC.toml STRATEGY [STEPS]

Builds the strategy's engine in this process (one GPU, torchrun's variables set by the device setup),
trains STEPS steps (default 3) with torch's allocator history on, replays the history of the last step,
and prints the live allocations at its peak grouped by the first frame in DeepSpeed, transformers or
offloadlab, beside torch's own max_memory_allocated for that step.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch

from offloadlab.engines.base import build_engine
from offloadlab.engines.dist import DistContext
from offloadlab.spec import load_spec
from offloadlab.workload.data import TokenSource

OWN_CODE = ("/deepspeed/", "/transformers/", "/offloadlab/")
GIB = 2**30


def label(frames: list[dict]) -> str:
    for frame in frames:
        name = frame["filename"]
        for marker in OWN_CODE:
            if marker in name:
                return f"{marker.strip('/')}/{name.split(marker)[-1]}:{frame['line']} {frame['name']}"
    return "other"


def peak_live(trace: list[dict], first: int) -> tuple[int, dict[str, list[int]]]:
    """Replay alloc / free events; the live blocks at the highest point reached at or after event `first`."""
    live: dict[int, tuple[int, str]] = {}
    total, best, best_live = 0, -1, {}
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], label(event["frames"]))
            total += event["size"]
            if i >= first and total > best:
                best, best_live = total, dict(live)
        elif event["action"] == "free_requested" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
    groups: dict[str, list[int]] = defaultdict(list)
    for size, where in best_live.values():
        groups[where].append(size)
    return best, groups


def main(spec_path: str, strategy_name: str, steps: int = 3) -> None:
    spec = load_spec(Path(spec_path))
    strategy = spec.get_strategy(strategy_name)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=4_000_000)
    ctx = DistContext.from_env()
    engine = build_engine(spec, strategy, ctx, nvme_dir=None)
    source = TokenSource.for_run(spec)
    first = 0
    for step in range(1, steps + 1):
        if step == steps:
            first = len(torch.cuda.memory._snapshot()["device_traces"][ctx.local_rank])
            torch.cuda.reset_peak_memory_stats()
        engine.train_step(source.micro_batches(step - 1, ctx.rank, ctx.world_size, spec.micro_batch, spec.grad_accum))
        torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][ctx.local_rank]
    best, groups = peak_live(trace, first)
    print(
        f"{spec.name} {strategy_name}: step {steps} peak {torch.cuda.max_memory_allocated() / GIB:.3f} GiB "
        f"(replayed {best / GIB:.3f} GiB, {len(trace)} events)"
    )
    for where, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:25]:
        print(f"  {sum(sizes) / GIB:8.3f} GiB {len(sizes):6d}x  {where}")
    engine.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))
