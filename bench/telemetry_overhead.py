"""Step time with the sampler on vs off, in one process on one built engine, blocks alternating.

    python bench/telemetry_overhead.py SPEC --strategy NAME [--blocks 6 --steps-per-block 5 --hz 10]

Goal (issue 4): under 1% overhead. "process" is the side-process sampler `offloadlab run` uses. (A
thread in the training process cost +7.0% on an H200 in bench/results/2026-12-02-h200-s3; the tool no
longer offers it.) Alternating blocks on the same engine cancels drift
(warm-up, thermal, page cache) that separate runs would fold into the ratio; each sampled block is also
compared with the mean of the unsampled blocks beside it, and the spread of those ratios says how far to
trust the median.

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

from offloadlab.engines.base import build_engine
from offloadlab.engines.dist import DistContext
from offloadlab.results.store import RunStore
from offloadlab.spec import load_spec
from offloadlab.telemetry.sampler import SamplerProcess
from offloadlab.workload.data import TokenSource


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", type=Path)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps-per-block", type=int, default=5)
    parser.add_argument("--hz", type=float, default=10.0)
    args = parser.parse_args()
    for key, value in dict(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    ).items():
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
        source = TokenSource.for_run(spec)
        arms = ["process"]
        times: dict[str, list[float]] = {arm: [] for arm in ["off", *arms]}
        step = 0
        samplers = {
            "process": lambda: SamplerProcess(run_dir, strategy_id, hz=args.hz, nvme_path=nvme_dir),
        }

        def run_block(arm: str) -> None:
            nonlocal step
            for _ in range(args.steps_per_block):
                batches = source.micro_batches(step, ctx.rank, ctx.world_size, spec.micro_batch, spec.grad_accum)
                start = time.perf_counter()
                engine.train_step(batches)
                if ctx.device.type == "cuda":
                    torch.cuda.synchronize()
                times[arm].append(time.perf_counter() - start)
                engine.phase.drain()
                step += 1

        run_block("off")  # warm-up, discarded
        times["off"].clear()
        block_medians: list[tuple[str, float]] = []
        for block in range(args.blocks):
            arm = arms[(block // 2) % len(arms)] if block % 2 == 0 else "off"
            if arm == "off":
                run_block(arm)
            else:
                with samplers[arm]():
                    run_block(arm)
            block_medians.append((arm, statistics.median(times[arm][-args.steps_per_block :])))
        samples = store.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        gpu_fields = bool(store.samples(strategy_id, "gpu%"))
        cross_check = (
            gpu_busy_cross_check(run_block, store, run_dir, strategy_id, nvme_dir, args.hz, scratch)
            if ctx.device.type == "cuda"
            else None
        )
        engine.close()
    off = statistics.median(times["off"])
    model = spec.model.preset or spec.model.hf_model or spec.model.hf_config
    table = Table(title=f"telemetry overhead: {strategy.name}, {model}, {args.hz:g} Hz")
    for col in (
        "sampler",
        "steps",
        "median step (s)",
        "mean step (s)",
        "median vs off",
        "per block vs neighbours: median (quartiles)",
    ):
        table.add_column(col)
    for arm, values in times.items():
        pairs = paired_ratios(block_medians, arm) if arm != "off" else []
        quartiles = (statistics.quantiles(pairs, n=4) if len(pairs) > 1 else [pairs[0]] * 3) if pairs else None
        table.add_row(
            arm,
            str(len(values)),
            f"{statistics.median(values):.4f}",
            f"{statistics.mean(values):.4f}",
            "-" if arm == "off" else f"{100 * (statistics.median(values) / off - 1):+.2f}%",
            "-"
            if not quartiles
            else f"{100 * (quartiles[1] - 1):+.2f}% ({100 * (quartiles[0] - 1):+.2f}% .. "
            f"{100 * (quartiles[2] - 1):+.2f}%) over {len(pairs)} blocks",
        )
    console = Console(width=150)
    console.print(table)
    console.print(f"{samples} sample rows written, GPU fields {'present' if gpu_fields else 'absent'}")
    if cross_check:
        console.print(
            "GPU busy cross-check (one sampled block): CUDA profiler kernel time {kernel:.1%} of wall; "
            "sampler (NVML utilization) {nvml:.1%} busy, i.e. GPU idle {idle:.1%}".format(**cross_check)
        )


def paired_ratios(block_medians: list[tuple[str, float]], arm: str) -> list[float]:
    """Each of `arm`'s blocks: its median step over the mean of the unsampled blocks next to it."""
    out = []
    for i, (this_arm, median) in enumerate(block_medians):
        if this_arm != arm:
            continue
        neighbours = [m for j, (a, m) in enumerate(block_medians) if a == "off" and abs(i - j) == 1]
        if neighbours:
            out.append(median / statistics.mean(neighbours))
    return out


def gpu_busy_cross_check(
    run_block, store: RunStore, run_dir: Path, strategy_id: int, nvme_dir: Path, hz: float, scratch: str
) -> dict:
    from torch.profiler import ProfilerActivity, profile

    trace = Path(scratch) / "trace.json"
    with SamplerProcess(run_dir, strategy_id, hz=hz, nvme_path=nvme_dir):
        t0 = time.time()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            wall_start = time.perf_counter()
            run_block("process")
            wall = time.perf_counter() - wall_start
        t1 = time.time()
    prof.export_chrome_trace(str(trace))
    kernels = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in json.loads(trace.read_text())["traceEvents"]
        if e.get("cat") == "kernel" and "dur" in e
    )
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
