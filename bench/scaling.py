"""The same spec at several world sizes, same effective batch: step time, memory per rank, communication.

    python bench/scaling.py SPEC --nproc 1 2 [--results FILE.json]

For each world size N the spec runs with nproc = N and grad_accum = (spec's grad_accum x spec's nproc) / N,
so every run sees the same samples per step. Printed per strategy and N: median step time and its ratio
to the first N (speedup), tokens/s, peak bytes per rank (GPU allocated with a GPU, host RSS without) and
its ratio, and rank 0's collective bytes and blocking time per step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import tomli_w
from rich.console import Console
from rich.table import Table

from offloadlab.results.store import RunStore
from offloadlab.results.summary import summarize
from offloadlab.results.tables import human_bytes


def spec_at(raw: dict, nproc: int) -> dict:
    samples = raw.get("grad_accum", 1) * raw.get("nproc", 1)
    if samples % nproc:
        raise SystemExit(
            f"grad_accum x nproc = {samples} is not divisible by {nproc}: the effective batch would change"
        )
    return {**raw, "nproc": nproc, "grad_accum": samples // nproc, "name": f"{raw.get('name', 'run')}-n{nproc}"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", type=Path)
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    raw = tomllib.loads(args.spec.read_text())
    console = Console(width=170)
    results: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for n in args.nproc:
            spec_path = Path(scratch) / f"n{n}.toml"
            spec_path.write_text(tomli_w.dumps(spec_at(raw, n)))
            run_dir = Path(scratch) / f"run-n{n}"
            subprocess.run(
                [sys.executable, "-m", "offloadlab.cli", "run", str(spec_path), "--out", str(run_dir)], check=True
            )
            results[n] = {s.name: s.as_dict() for s in summarize(RunStore(run_dir))}
    base = args.nproc[0]
    table = Table(
        title=f"scaling {args.spec}: same effective batch at nproc {', '.join(map(str, args.nproc))}",
        header_style="bold",
    )
    for col in (
        "strategy",
        "nproc",
        "status",
        "step (s)",
        "speedup",
        "tokens/s",
        "peak / rank",
        "vs first",
        "comm/step",
        "comm (s)",
    ):
        table.add_column(col, justify="left" if col in ("strategy", "status") else "right")
    for name in results[base]:
        for n in args.nproc:
            s, first = results[n][name], results[base][name]

            def peak(x):
                return x["peak_allocated_bytes"] or x["host_rss_peak_bytes"]

            speedup = (
                first["median_step_time_s"] / s["median_step_time_s"]
                if s["median_step_time_s"] and first["median_step_time_s"]
                else None
            )
            memory_ratio = peak(s) / peak(first) if peak(s) and peak(first) else None
            table.add_row(
                name,
                str(n),
                s["status"],
                f"{s['median_step_time_s'] or 0:.3f}",
                "-" if speedup is None else f"{speedup:.2f}x",
                f"{s['tokens_per_s'] or 0:,.0f}",
                human_bytes(peak(s)),
                "-" if memory_ratio is None else f"{memory_ratio:.2f}",
                human_bytes(s["comm_bytes_per_step"]),
                f"{s['comm_seconds_per_step'] or 0:.3f}",
            )
    console.print(table)
    if args.results:
        args.results.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
