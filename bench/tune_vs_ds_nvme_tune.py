"""Our tuner against DeepSpeed's `ds_nvme_tune`, on the same directory, in the same run.

    python bench/tune_vs_ds_nvme_tune.py --nvme DIR [--quick] [--results FILE.json]

Goal (issue 3): at least ds_nvme_tune's best read and write GB/s in at most a third of its wall time.
Both sweeps run on files they create in their own subfolders of DIR, removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
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
    # ds_nvme_tune reports its best read and best write apart (each from whichever point won it), so the
    # like-for-like figures are our best mean read and best mean write over all points; the chosen
    # point's are the best for the workload's mix.
    return {"wall_s": wall, "sweep_s": result["seconds"], "read_gbps": max(p["read_gbps"] for p in result["points"]),
            "write_gbps": max(p["write_gbps"] for p in result["points"]), "chosen_read_gbps": result["read_gbps"],
            "chosen_write_gbps": result["write_gbps"], "config": result["best"], "points": len(result["points"])}


def _partial_ds_results(logs: Path) -> dict:
    """Best read and write among the points ds_nvme_tune finished, parsed by its own log reader."""
    from deepspeed.nvme.parse_nvme_stats import READ_SPEED, WRITE_SPEED, get_sorted_results
    from deepspeed.nvme.perf_sweep_utils import READ_LOG_DIR, WRITE_LOG_DIR

    out = {}
    for label, folder, key in (("read", READ_LOG_DIR, READ_SPEED), ("write", WRITE_LOG_DIR, WRITE_SPEED)):
        path = logs / folder
        results = get_sorted_results(str(path), key)[1] if path.is_dir() and any(path.iterdir()) else {}
        out[f"{label}_points_done"] = len(results)
        speeds = [v for v in results.values() if v is not None]  # a point cut off mid-run has no speed
        out[f"{label}_gbps"] = max(speeds) if speeds else None
    return out


def run_ds_nvme_tune(nvme: Path, timeout_s: float) -> dict:
    work = nvme / "ds-nvme-tune"
    work.mkdir()
    logs = Path(tempfile.mkdtemp())
    # Next to this interpreter when run from a venv that is not on PATH.
    tool = shutil.which("ds_nvme_tune") or str(Path(sys.executable).parent / "ds_nvme_tune")
    start = time.perf_counter()
    proc = subprocess.Popen([tool, "--nvme_dir", str(work), "--log_dir", str(logs)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=logs, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
        finished = True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        finished = False
    finally:
        wall = time.perf_counter() - start
        shutil.rmtree(work, ignore_errors=True)
    try:
        match = BEST_LINE.search(stdout)
        if finished and match:
            config = json.loads(stdout[stdout.index("{", match.end()):])["aio"]
            return {"finished": True, "wall_s": wall, "read_gbps": float(match.group(1)),
                    "write_gbps": float(match.group(2)), "config": config}
        return {"finished": False, "wall_s": wall, **_partial_ds_results(logs)}
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def main() -> None:
    # `timeout` and schedulers send SIGTERM: clean up as for Ctrl-C (the finally blocks above).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvme", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results", type=Path)
    parser.add_argument("--ds-timeout", type=float, default=3600, help="Stop ds_nvme_tune after this many seconds.")
    args = parser.parse_args()
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as out:
        ours = run_ours(args.nvme, args.quick, Path(out) / "ours")
    console.print(f"offloadlab tune: {ours['wall_s']:.1f} s wall ({ours['sweep_s']:.1f} s sweeping), best read "
                  f"{ours['read_gbps']:.2f} GB/s, best write {ours['write_gbps']:.2f} GB/s; chosen for the mix "
                  f"{json.dumps(ours['config'])}: read {ours['chosen_read_gbps']:.2f}, write {ours['chosen_write_gbps']:.2f}")
    results = {"ours": ours}
    if args.results:  # kept even if ds_nvme_tune is stopped from outside
        args.results.write_text(json.dumps(results, indent=2))
    ds = run_ds_nvme_tune(args.nvme, args.ds_timeout)
    results["ds_nvme_tune"] = ds
    if ds["finished"]:
        table = Table(title=f"tuner comparison on {args.nvme}")
        for col in ("tuner", "wall (s)", "best read GB/s", "best write GB/s", "config"):
            table.add_column(col)
        for name, r in (("offloadlab tune" + (" --quick" if args.quick else ""), ours), ("ds_nvme_tune", ds)):
            table.add_row(name, f"{r['wall_s']:.1f}", f"{r['read_gbps']:.2f}", f"{r['write_gbps']:.2f}", json.dumps(r["config"]))
        console.print(table)
        ratios = {"time_ours_over_ds": ours["wall_s"] / ds["wall_s"], "read_ours_over_ds": ours["read_gbps"] / ds["read_gbps"],
                  "write_ours_over_ds": ours["write_gbps"] / ds["write_gbps"]}
        met = ratios["time_ours_over_ds"] <= 1 / 3 and min(ratios["read_ours_over_ds"], ratios["write_ours_over_ds"]) >= 1
        console.print("ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items()) + f"; goal {'met' if met else 'NOT met'}")
        results["ratios"] = ratios
    else:
        console.print(f"ds_nvme_tune stopped unfinished after {ds['wall_s']:.0f} s (time ratio ours/ds <= "
                      f"{ours['wall_s'] / ds['wall_s']:.3f}); among the points it finished: read {ds['read_points_done']} "
                      f"points, best {ds['read_gbps']} GB/s; write {ds['write_points_done']} points, best {ds['write_gbps']} GB/s")
    if args.results:
        args.results.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
