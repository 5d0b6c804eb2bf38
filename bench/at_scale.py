"""Issue 7: the side-by-side comparison at scale, run through offloadlab's own CLI as a user would.

    python bench/at_scale.py SPEC --nvme DIR --results FOLDER [--run-dir DIR] [--full-tune] [--only NAME ...]
    python bench/at_scale.py SPEC --results FOLDER --from-results   # the tables of a cut-off run

1. `offloadlab tune --nvme DIR --quick --spec SPEC --json`: the aio settings, the drive's measured read and
   write ceilings (best of every point and the plain O_DIRECT baseline) and the pinned PCIe copy rates.
2. A copy of SPEC where each NVMe strategy gets a twin `<name>-tuned` including the tune fragment: the twin
   keeps the strategy's own buffer settings, so only the aio section differs.
3. `offloadlab run` of that copy (real steps, telemetry, checkpoints verified), then `compare` and `report`.
4. Each strategy's mean steady step (tokens over time) against its I/O floor: NVMe bytes per step over the
   drive's ceilings (one drive: read and write time add) and PCIe bytes per step (NVML) over the pinned
   copy rates; the floor is the slowest link's time, the ratio is step / floor. Beside it, the RAM
   DeepSpeed pinned for swap buffers against what the tuner's sizing predicts for that strategy.
5. bench/plan_accuracy's predicted vs measured table for the same run.
Everything printed goes to FOLDER/at_scale.md with the commands; the store, logs and report are copied there.
The run directory (checkpoints, GBs at scale) belongs on the big drive: --run-dir. --only runs some of the
strategies (twins included by name, e.g. zero3-nvme zero3-nvme-tuned), to split a long comparison.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import tomli_w
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_accuracy import compare as plan_rows  # noqa: E402
from plan_accuracy import table as plan_table

from offloadlab.engines.deepspeed.buffers import pinned_swap_bytes, tuned_buffers  # noqa: E402
from offloadlab.plan.accounting import shape_of_spec  # noqa: E402
from offloadlab.results.store import DB_NAME, RunStore  # noqa: E402
from offloadlab.results.summary import summarize  # noqa: E402
from offloadlab.spec import parse_spec  # noqa: E402

console = Console(width=180, record=True)
commands: list[str] = []


def offloadlab(*args: str, capture: bool = False) -> str:
    cmd = [sys.executable, "-m", "offloadlab.cli", *args]
    commands.append("offloadlab " + shlex.join(args))
    console.print(f"[bold]$ {commands[-1]}[/]")
    proc = subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE if capture else None)
    return proc.stdout if capture else ""


def strategies_with_twins(spec_path: Path, fragment: Path | None, only: list[str] | None) -> list[dict]:
    """The spec's strategy tables, each NVMe one followed by its `-tuned` twin, filtered by --only."""
    strategies = []
    for s in tomllib.loads(spec_path.read_text())["strategy"]:
        strategies.append(s)
        if "nvme" in (s.get("offload_optimizer"), s.get("offload_param")):
            twin = {**s, "name": f"{s['name']}-tuned"}
            strategies.append(twin | ({"tuned": str(fragment.resolve())} if fragment else {}))
    if not only:
        return strategies
    unknown = set(only) - {s["name"] for s in strategies}
    if unknown:
        raise SystemExit(
            f"--only: no strategy named {', '.join(sorted(unknown))}; "
            f"there are {', '.join(s['name'] for s in strategies)}"
        )
    by_name = {s["name"]: s for s in strategies}
    return [by_name[name] for name in only]  # in --only's order: a repeat can swap who runs first


def with_tuned_twins(spec_path: Path, fragment: Path, nvme: Path, out: Path, only: list[str] | None) -> Path:
    raw = tomllib.loads(spec_path.read_text())
    raw["nvme_path"] = str(nvme)
    raw["strategy"] = strategies_with_twins(spec_path, fragment, only)
    out.write_text(tomli_w.dumps(raw))
    return out


def floors_table(run_dir: Path, tune: dict) -> Table:
    points = tune["points"]
    read_ceiling = max([p["read_gbps"] for p in points] + [tune["direct_io"]["read_gbps"]]) * 1e9
    write_ceiling = max([p["write_gbps"] for p in points] + [tune["direct_io"]["write_gbps"]]) * 1e9
    pcie = tune["pcie"] or {}
    h2d, d2h = pcie.get("host_to_device_gbps", 0) * 1e9, pcie.get("device_to_host_gbps", 0) * 1e9
    out = Table(
        title="step time against the slowest link (bytes measured per step / bandwidth measured in this run)",
        header_style="bold",
    )
    store = RunStore(run_dir)
    spec = parse_spec(tomllib.loads(store.run()["spec_toml"]))
    tokens_per_step = spec.seq_len * spec.micro_batch * spec.grad_accum * spec.nproc
    for col in (
        "strategy",
        "step (s)\nmean / p90",
        "pinned GiB\nrun / tune",
        "NVMe read / write\nGB per step",
        "NVMe time (s)\nserial / overlap",
        "PCIe h2d / d2h\nGB per step",
        "PCIe time (s)",
        "floor (s)\nserial / overlap",
        "step / floor\nserial / overlap",
    ):
        out.add_column(col, justify="left" if col == "strategy" else "right")
    for s in summarize(store):
        if not s.tokens_per_s:
            out.add_row(s.name, "-", "-", "-", "-", "-", "-", "-", s.status)
            continue
        step_s = tokens_per_step / s.tokens_per_s
        strategy = spec.get_strategy(s.name)
        planned = (
            pinned_swap_bytes(strategy, shape_of_spec(spec), spec.nproc, tuned_buffers(spec, strategy, strategy.aio))
            if getattr(strategy, "swaps_parameters", False)
            else 0
        )
        read, written = s.disk_read_bytes_per_step or 0, s.disk_write_bytes_per_step or 0
        # The drive's reads and writes one after the other (the floor if it cannot do both at once), and
        # overlapped (the floor if it can: the H200 machines' virtio disk did, session 12).
        nvme_serial_s = read / read_ceiling + written / write_ceiling
        nvme_overlap_s = max(read / read_ceiling, written / write_ceiling)
        # NVML reports from the GPU's side: RX is host -> device.
        to_gpu = (s.pcie_rx_bytes_per_s or 0) * step_s
        from_gpu = (s.pcie_tx_bytes_per_s or 0) * step_s
        pcie_s = max(to_gpu / h2d, from_gpu / d2h) if h2d and d2h else 0.0
        floors = max(nvme_serial_s, pcie_s), max(nvme_overlap_s, pcie_s)
        bound = floors[0] >= 0.05 * step_s
        out.add_row(
            s.name,
            f"{step_s:.3f} / {s.p90_step_time_s:.3f}",
            f"{(s.pinned_swap_bytes or 0) / 2**30:.2f} / {planned / 2**30:.2f}",
            f"{read / 1e9:.2f} / {written / 1e9:.2f}",
            f"{nvme_serial_s:.2f} / {nvme_overlap_s:.2f}",
            f"{to_gpu / 1e9:.2f} / {from_gpu / 1e9:.2f}",
            f"{pcie_s:.3f}",
            " / ".join(f"{f:.2f}" for f in floors),
            " / ".join(f"{step_s / f:.2f}x" for f in floors) if bound else "no link floor",
        )
    out.caption = (
        f"drive ceilings read {read_ceiling / 1e9:.2f} / write {write_ceiling / 1e9:.2f} GB/s (best tune point or "
        f"O_DIRECT baseline); pinned PCIe {h2d / 1e9:.1f} / {d2h / 1e9:.1f} GB/s; 'no link floor': links "
        "explain < 5% of the step (compute-bound)"
    )
    return out


def copy_results(run_dir: Path, results: Path) -> None:
    dest = results / "run"
    dest.mkdir(parents=True, exist_ok=True)
    store = RunStore(run_dir)
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    for name in (DB_NAME, "spec.toml", "report.html"):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, dest / name)
    shutil.copytree(run_dir / "logs", dest / "logs", dirs_exist_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", type=Path)
    parser.add_argument("--nvme", type=Path, help="The drive's folder (required unless --from-results)")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, help="Default: RESULTS/run-dir")
    parser.add_argument("--full-tune", action="store_true", help="The full sweep instead of --quick")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="Run only these strategies, in this order (twins by their -tuned name)",
    )
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="Write at_scale.md and the report from a cut-off run's RESULTS (its store, spec.toml, tune.json, "
        "tune/): no tune, no run",
    )
    args = parser.parse_args()
    if args.from_results:
        render(args.spec, args.results)
        return
    if args.nvme is None:
        parser.error("--nvme is required to tune and run")
    args.results.mkdir(parents=True, exist_ok=True)
    run_dir = args.run_dir or args.results / "run-dir"
    work = args.results / "work"
    work.mkdir(exist_ok=True)
    started = time.time()
    strategies_with_twins(args.spec, None, args.only)  # a misspelt --only fails before the tune
    tune = json.loads(
        offloadlab(
            "tune",
            "--nvme",
            str(args.nvme),
            *([] if args.full_tune else ["--quick"]),
            "--spec",
            str(args.spec),
            "--out",
            str(work / "tune"),
            "--json",
            capture=True,
        )
    )
    (args.results / "tune.json").write_text(json.dumps(tune, indent=2))
    console.print(
        f"tune: best {tune['best']} read {tune['read_gbps']:.2f} / write {tune['write_gbps']:.2f} GB/s in "
        f"{tune['seconds']:.0f} s; PCIe {tune['pcie']}"
    )
    spec = with_tuned_twins(args.spec, Path(tune["fragment"]), args.nvme, work / "spec.toml", args.only)
    try:
        offloadlab("run", str(spec), "--out", str(run_dir))
        show_results(spec, run_dir, tune, work / "tune", args.spec)
    finally:
        if (run_dir / DB_NAME).exists():
            copy_results(run_dir, args.results)
        write_markdown(args.results, args.spec, started)


def show_results(spec: Path, run_dir: Path, tune: dict, tune_dir: Path | None, title: Path) -> None:
    """compare, report, the floors and (with the tune folder of this machine's run) the plan's accuracy."""
    console.print(offloadlab("compare", str(run_dir), capture=True), markup=False, highlight=False)
    offloadlab("report", str(run_dir))
    console.print(floors_table(run_dir, tune))
    if tune_dir is not None:
        console.print(plan_table(plan_rows(spec, run_dir, console, tuned_dir=tune_dir), f"plan accuracy: {title}"))


def write_markdown(results: Path, spec: Path, started: float) -> None:
    (results / "at_scale.md").write_text(
        f"# {spec} at scale ({time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s)\n\n"
        f"```\npython bench/at_scale.py {shlex.join(sys.argv[1:])}\n```\n\nCommands it ran:\n\n```\n"
        + "\n".join(commands)
        + "\n```\n\nOutput:\n\n```\n"
        + console.export_text()
        + "```\n"
    )


def render(spec: Path, results: Path) -> None:
    """The tables of a run whose at_scale was cut off before it wrote them, but for the plan's accuracy:
    its links would be this machine's, not the run's (bench/plan_accuracy.py --store --links for that)."""
    missing = [name for name in (DB_NAME, "spec.toml", "tune.json") if not (results / name).is_file()]
    if missing:
        raise SystemExit(
            f"--from-results: {results} lacks {', '.join(missing)}; give the folder a cut-off "
            "at_scale run wrote (its store, spec.toml and tune.json)"
        )
    started = time.time()
    show_results(results / "spec.toml", results, json.loads((results / "tune.json").read_text()), None, spec)
    write_markdown(results, spec, started)


if __name__ == "__main__":
    main()
