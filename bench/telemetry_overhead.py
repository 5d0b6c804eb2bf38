"""Step time with the sampler on vs off, in one process on one built engine, blocks alternating (ABAB...).

    python bench/telemetry_overhead.py SPEC --strategy NAME [--blocks 6 --steps-per-block 5 --hz 10]

Goal (issue 4): under 1% overhead. Alternating blocks on the same engine cancels drift (warm-up, thermal,
page cache) that two separate runs would fold into the ratio; each sampled block is also compared with
the mean of the unsampled blocks beside it, and the spread of those ratios says how far to trust the median.

On a GPU it then cross-checks the sampler's "GPU idle" (1 - NVML utilization) against the kernels the
CUDA profiler saw in one more sampled block: busy share = union of kernel intervals / block wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from offloadlab.data import TokenSource
from offloadlab.engines import DistContext, build_engine
from offloadlab.spec import load_spec
from offloadlab.store import RunStore
from offloadlab.telemetry import Sampler
from offloadlab.worker import vocab_size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", type=Path)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps-per-block", type=int, default=5)
    parser.add_argument("--hz", type=float, default=10.0)
    args = parser.parse_args()
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
        os.environ.setdefault(key, value)
    spec = load_spec(args.spec)
    strategy = spec.get_strategy(args.strategy)
    ctx = DistContext.from_env()
    with tempfile.TemporaryDirectory(dir=spec.nvme_path) as scratch:
        run_dir, nvme_dir = Path(scratch) / "run", Path(scratch) / "nvme"
        run_dir.mkdir(), nvme_dir.mkdir()
        store = RunStore(run_dir, create_schema=True)
        strategy_id = store.add_strategy(store.add_run("overhead", ""), strategy.name, strategy.engine, {}, 0)
        engine = build_engine(spec, strategy, ctx, nvme_dir)
        source = TokenSource(spec.data, vocab_size(spec), spec.seq_len, spec.seed)
        times: dict[bool, list[float]] = {True: [], False: []}
        step = 0

        def run_block(sampled: bool) -> None:
            nonlocal step
            for _ in range(args.steps_per_block):
                batches = source.micro_batches(step, ctx.rank, ctx.world_size, spec.micro_batch, spec.grad_accum)
                start = time.perf_counter()
                engine.train_step(batches)
                if ctx.device.type == "cuda":
                    torch.cuda.synchronize()
                times[sampled].append(time.perf_counter() - start)
                engine.phase.drain()
                step += 1

        run_block(False)  # warm-up, discarded
        times[False].clear()
        block_medians: list[tuple[bool, float]] = []
        for block in range(args.blocks):
            sampled = block % 2 == 0
            if sampled:
                with Sampler(run_dir, strategy_id, hz=args.hz, nvme_path=nvme_dir) as sampler:
                    run_block(True)
            else:
                run_block(False)
            block_medians.append((sampled, statistics.median(times[sampled][-args.steps_per_block:])))
        samples = store.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        cross_check = gpu_busy_cross_check(run_block, store, run_dir, strategy_id, nvme_dir, args.hz, scratch) \
            if ctx.device.type == "cuda" else None
        engine.close()
    on, off = statistics.median(times[True]), statistics.median(times[False])
    table = Table(title=f"telemetry overhead: {strategy.name}, {spec.model.preset or spec.model.hf_config}, {args.hz:g} Hz")
    for col in ("sampler", "steps", "median step (s)", "mean step (s)"):
        table.add_column(col)
    for sampled in (False, True):
        table.add_row("on" if sampled else "off", str(len(times[sampled])), f"{statistics.median(times[sampled]):.4f}",
                      f"{statistics.mean(times[sampled]):.4f}")
    console = Console(width=150)
    console.print(table)
    console.print(f"overhead (median on / median off - 1) = {100 * (on / off - 1):+.2f}%   "
                  f"({samples} sample rows written, GPU fields {'present' if sampler.gpu else 'absent'})")
    pairs = paired_ratios(block_medians)
    if pairs:
        quartiles = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else [pairs[0]] * 3
        console.print(f"per sampled block vs its unsampled neighbours: median {100 * (quartiles[1] - 1):+.2f}%, "
                      f"quartiles {100 * (quartiles[0] - 1):+.2f}% .. {100 * (quartiles[2] - 1):+.2f}% over {len(pairs)} blocks")
    if cross_check:
        console.print("GPU busy cross-check (one sampled block): CUDA profiler kernel time {kernel:.1%} of wall; "
                      "sampler (NVML utilization) {nvml:.1%} busy, i.e. GPU idle {idle:.1%}".format(**cross_check))


def paired_ratios(block_medians: list[tuple[bool, float]]) -> list[float]:
    """Each sampled block's median step over the mean of the unsampled blocks next to it."""
    out = []
    for i, (sampled, median) in enumerate(block_medians):
        if not sampled:
            continue
        neighbours = [m for j, (s, m) in enumerate(block_medians) if not s and abs(i - j) == 1]
        if neighbours:
            out.append(median / statistics.mean(neighbours))
    return out


def gpu_busy_cross_check(run_block, store: RunStore, run_dir: Path, strategy_id: int, nvme_dir: Path, hz: float,
                         scratch: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    trace = Path(scratch) / "trace.json"
    with Sampler(run_dir, strategy_id, hz=hz, nvme_path=nvme_dir):
        t0 = time.time()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            wall_start = time.perf_counter()
            run_block(True)
            wall = time.perf_counter() - wall_start
        t1 = time.time()
    prof.export_chrome_trace(str(trace))
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in json.loads(trace.read_text())["traceEvents"]
                     if e.get("cat") == "kernel" and "dur" in e)
    busy_us, end = 0.0, float("-inf")
    for a, b in kernels:  # union of intervals: kernels on several streams may overlap
        if b > end:
            busy_us += b - max(a, end)
            end = b
    util = [r[2] for r in store.samples(strategy_id, "gpu%.util(%)") if t0 <= r[0] <= t1 and r[2] is not None]
    nvml_busy = statistics.mean(util) / 100 if util else float("nan")
    return {"kernel": busy_us / 1e6 / wall, "nvml": nvml_busy, "idle": 1 - nvml_busy}


if __name__ == "__main__":
    main()
