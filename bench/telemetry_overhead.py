"""Step time with the sampler on vs off, in one process on one built engine, blocks alternating (ABAB...).

    python bench/telemetry_overhead.py SPEC --strategy NAME [--blocks 6 --steps-per-block 5 --hz 10]

Goal (issue 4): under 1% overhead. Alternating blocks on the same engine cancels drift (warm-up, thermal,
page cache) that two separate runs would fold into the ratio.
"""

from __future__ import annotations

import argparse
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
        for block in range(args.blocks):
            sampled = block % 2 == 0
            if sampled:
                with Sampler(run_dir, strategy_id, hz=args.hz, nvme_path=nvme_dir) as sampler:
                    run_block(True)
            else:
                run_block(False)
        samples = store.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
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


if __name__ == "__main__":
    main()
