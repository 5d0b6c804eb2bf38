"""Our tuner against DeepSpeed's `ds_nvme_tune`, on the same directory, in the same run.

    python bench/tune_vs_ds_nvme_tune.py --nvme DIR [--quick] [--results FILE.json]

Goal (issue 3): at least ds_nvme_tune's best read and write GB/s in at most a third of its wall time.
Both sweeps run on files they create in their own subfolders of DIR, removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

BEST_LINE = re.compile(r"Best performance \(GB/sec\): read =\s*([\d.]+), write =\s*([\d.]+)")


def run_ours(nvme: Path, quick: bool, out: Path) -> dict:
    cmd = [sys.executable, "-m", "offloadlab.cli", "tune", "--nvme", str(nvme), "--json", "--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    return {"wall_s": wall, "read_gbps": result["read_gbps"], "write_gbps": result["write_gbps"],
            "config": result["best"], "points": len(result["points"])}


def run_ds_nvme_tune(nvme: Path) -> dict:
    work = nvme / "ds-nvme-tune"
    work.mkdir()
    logs = Path(tempfile.mkdtemp())
    try:
        start = time.perf_counter()
        # Next to this interpreter when run from a venv that is not on PATH.
        tool = shutil.which("ds_nvme_tune") or str(Path(sys.executable).parent / "ds_nvme_tune")
        proc = subprocess.run([tool, "--nvme_dir", str(work), "--log_dir", str(logs)],
                              capture_output=True, text=True, cwd=logs)
        wall = time.perf_counter() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)
    match = BEST_LINE.search(proc.stdout)
    if match is None:
        raise SystemExit(f"ds_nvme_tune printed no result (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    config = json.loads(proc.stdout[proc.stdout.index("{", match.end()):])
    shutil.rmtree(logs, ignore_errors=True)
    return {"wall_s": wall, "read_gbps": float(match.group(1)), "write_gbps": float(match.group(2)), "config": config["aio"]}


def main() -> None:
    # `timeout` and schedulers send SIGTERM: clean up as for Ctrl-C (the finally blocks above).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvme", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        ours = run_ours(args.nvme, args.quick, Path(out) / "ours")
    ds = run_ds_nvme_tune(args.nvme)
    table = Table(title=f"tuner comparison on {args.nvme}")
    for col in ("tuner", "wall (s)", "best read GB/s", "best write GB/s", "read+write", "config"):
        table.add_column(col)
    for name, r in (("offloadlab tune" + (" --quick" if args.quick else ""), ours), ("ds_nvme_tune", ds)):
        table.add_row(name, f"{r['wall_s']:.1f}", f"{r['read_gbps']:.2f}", f"{r['write_gbps']:.2f}",
                      f"{r['read_gbps'] + r['write_gbps']:.2f}", json.dumps(r["config"]))
    console = Console(width=200)
    console.print(table)
    ratios = {"time_ours_over_ds": ours["wall_s"] / ds["wall_s"],
              "read_ours_over_ds": ours["read_gbps"] / ds["read_gbps"],
              "write_ours_over_ds": ours["write_gbps"] / ds["write_gbps"]}
    console.print("ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items()))
    console.print("goal: time <= 0.33 and read, write >= 1.00 -> "
                  + ("met" if ratios["time_ours_over_ds"] <= 1 / 3 and min(ratios["read_ours_over_ds"], ratios["write_ours_over_ds"]) >= 1 else "NOT met"))
    if args.results:
        args.results.write_text(json.dumps({"ours": ours, "ds_nvme_tune": ds, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
