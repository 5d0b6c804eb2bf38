"""The planner's predictions against a real run of the same spec, strategy by strategy.

    python bench/plan_accuracy.py SPEC [--out RUN_DIR] [--results FILE.json]
    python bench/plan_accuracy.py SPEC --store RUN_DIR [--links PLAN.json | --gpus 1 --gpu-mem 139.8 --host-mem 125]
                                   [--tuned DIR]

Runs `offloadlab run SPEC` (real steps, telemetry on), then prints predicted vs measured peak GPU bytes
(torch.cuda.memory_stats' allocated peak), host RSS peak, NVMe bytes read and written per step (the
ranks' block-layer I/O) and the step time against the predicted lower bound, each with its ratio;
then the step by phase: forward + backward, the optimizer phase and the wait for NVMe swaps, measured
(the run's phase timings and swap meter) against the parts of the bound that fall there.
--store compares a run made before. For one made elsewhere give `offloadlab plan SPEC --json` from that
machine (--links: the machine it planned for, with its budget and pinned rounding, and the links measured
there: PCIe, CPU Adam, host passes, block compute) and its tune folder for the drive rates; without --links
the machine is this one unless --gpus, --gpu-mem and --host-mem say otherwise, and every link is measured here.
Goals (issue 6): GPU memory within +-10%, NVMe bytes within +-5%, step time within 1.5x.
Without a GPU the device is the CPU: GPU bytes are not measured and host RSS is compared with the
predicted host + device bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from offloadlab.measure.links import nvme_from_tune_store
from offloadlab.plan.accounting import Links, Machine, Placement, StepPrediction
from offloadlab.plan.inputs import PlanInputs, PlanRequest
from offloadlab.plan.output import machine_table
from offloadlab.plan.predict import predict
from offloadlab.results.store import RunStore
from offloadlab.results.summary import summarize
from offloadlab.spec import load_spec

GOALS = {"gpu": 0.10, "nvme_read": 0.05, "nvme_write": 0.05}
STEP_TIME_GOAL = 1.5


def load_links(plan_json: Path, tuned_dir: Path | None) -> Links:
    """The links of another machine's `plan --json`; its drive rates replaced by tuned_dir's, when given."""
    links = Links(**json.loads(plan_json.read_text())["links"])
    drive = nvme_from_tune_store(tuned_dir) if tuned_dir else None
    if drive:
        links = dataclasses.replace(links, nvme_read=drive[0], nvme_write=drive[1], nvme_source=drive[2])
    return links


def load_machine(plan_json: Path) -> Machine:
    """The machine another machine's `plan --json` planned for: its GPUs, budget, RAM and pinned rounding."""
    return Machine(**json.loads(plan_json.read_text())["machine"])


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    return None if not measured or not predicted else measured / predicted


def compare(
    spec_path: Path,
    run_dir: Path,
    console: Console,
    tuned_dir: Path | None = None,
    *,
    gpus: int | None = None,
    gpu_mem_gib: float | None = None,
    host_mem_gib: float | None = None,
    links: Links | None = None,
    machine: Machine | None = None,
) -> list[dict]:
    """The machine figures and links are those the run had, where it ran elsewhere; None: this machine's."""
    spec = load_spec(spec_path)
    request = PlanRequest(
        spec_path, gpus=gpus, gpu_mem_gib=gpu_mem_gib, host_mem_gib=host_mem_gib, tuned_dir=tuned_dir
    )
    inputs = PlanInputs.gather(request, console, links=links)
    if machine is not None:
        inputs = dataclasses.replace(inputs, machine=machine)
    console.print(machine_table(inputs.machine, inputs.links))  # the links every bound below is computed from
    measured = {s.name: s for s in summarize(RunStore(run_dir))}
    gpu = inputs.machine.gpu_mem_bytes is not None
    rows = []
    for strategy in spec.strategy:
        pred = predict(
            Placement(strategy, spec.model.activation_checkpointing),
            inputs.shape,
            inputs.machine,
            inputs.links,
            inputs.buffers,
        )
        m = measured[strategy.name]
        moved = pred.step.bytes_moved if pred.step else {}
        host_predicted = pred.memory.host_bytes + (0 if gpu else pred.memory.gpu_bytes)
        rows.append(
            {
                "strategy": strategy.name,
                "status": m.status,
                "gpu_predicted": pred.memory.gpu_bytes if gpu else None,
                "gpu_measured": m.peak_allocated_bytes,
                "host_predicted": host_predicted,
                "host_measured": m.host_rss_peak_bytes,
                "nvme_read_predicted": moved.get("nvme_read"),
                "nvme_read_measured": m.disk_read_bytes_per_step,
                "nvme_write_predicted": moved.get("nvme_write"),
                "nvme_write_measured": m.disk_write_bytes_per_step,
                "step_predicted": pred.step.seconds if pred.step else None,
                "step_measured": m.median_step_time_s,
                "step_parts": pred.step.parts if pred.step else None,
                **phase_fields(pred.step, m),
            }
        )
    return rows


def phase_fields(bound: StepPrediction | None, measured) -> dict:
    """The step split as a run's phase timings split it: forward + backward (with what overlaps them),
    the optimizer phase after backward, and the rest, predicted and measured (steady-step means); and the
    drive's time at the plan's rates against the time the step waited for its swaps."""
    phases = measured.phase_seconds or {}
    drive = [bound.parts[k] for k in ("nvme_params", "nvme_optimizer") if bound and k in bound.parts]
    return {
        "nvme_predicted": sum(drive) if drive else None,
        "nvme_measured": sum(measured.nvme_wait_seconds.values()) if measured.nvme_wait_seconds else None,
        "training_predicted": bound.training_s if bound else None,
        "training_measured": phases["forward"] + phases["backward"] if phases else None,
        "optimizer_predicted": bound.optimizer_s if bound else None,
        "optimizer_measured": phases.get("optimizer"),
        "other_measured": phases.get("other"),
        "mean_step_predicted": bound.seconds if bound else None,
        "mean_step_measured": measured.mean_step_time_s,
    }


def cell(row: dict, key: str, unit: float = 2**30, fmt: str = "{:.2f}", within=lambda r: True) -> str:
    p, m = row[f"{key}_predicted"], row[f"{key}_measured"]
    r = _ratio(m, p)
    text = f"{'-' if p is None else fmt.format(p / unit)} / {'-' if m is None else fmt.format(m / unit)}"
    if r is not None:
        text += f" ([{'green' if within(r) else 'red'}]{r:.2f}[/])"
    return text


def table(rows: list[dict], title: str) -> Table:
    out = Table(title=title, header_style="bold")
    out.add_column("strategy")
    for what in ("GPU peak", "host RSS", "NVMe read/step", "NVMe write/step", "step time"):
        out.add_column(f"{what}\npred / meas (ratio)", justify="right")
    for row in rows:
        out.add_row(
            f"{row['strategy']}\n[dim]{row['status']}[/]",
            cell(row, "gpu", within=lambda r: abs(r - 1) <= GOALS["gpu"]),
            cell(row, "host"),
            cell(row, "nvme_read", 2**20, "{:.1f}", lambda r: abs(r - 1) <= GOALS["nvme_read"]),
            cell(row, "nvme_write", 2**20, "{:.1f}", lambda r: abs(r - 1) <= GOALS["nvme_write"]),
            cell(row, "step", 1, "{:.3f}", lambda r: r <= STEP_TIME_GOAL),
        )
    out.caption = (
        "GiB, except NVMe (MiB) and step time (s); ratio = measured / predicted; "
        "goals: GPU +-10%, NVMe +-5%, step <= 1.5x"
    )
    return out


def phase_table(rows: list[dict], title: str) -> Table:
    """Where the predicted step and the measured one part: by phase, steady-step means."""
    out = Table(title=title, header_style="bold")
    out.add_column("strategy")
    for what in ("forward + backward", "optimizer phase", "mean step", "NVMe"):
        out.add_column(f"{what} s\npred / meas (ratio)", justify="right")
    out.add_column("other s\nmeas", justify="right")
    for row in rows:
        out.add_row(
            row["strategy"],
            *(cell(row, key, 1, "{:.3f}") for key in ("training", "optimizer", "mean_step", "nvme")),
            "-" if row["other_measured"] is None else f"{row['other_measured']:.3f}",
        )
    out.caption = (
        "the plan's bound split where a run's phase timings split a step; NVMe: the drive's time at the plan's "
        "rates, then the time the step waited for its swaps (less where compute hides them); "
        "ratio = measured / predicted"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", type=Path)
    parser.add_argument("--out", type=Path, help="Run directory (default: a temporary one)")
    parser.add_argument("--results", type=Path)
    parser.add_argument("--store", type=Path, help="Compare this run directory instead of running the spec")
    parser.add_argument("--gpus", type=int)
    parser.add_argument("--gpu-mem", type=float, help="GiB per GPU of the machine the run had")
    parser.add_argument("--host-mem", type=float)
    parser.add_argument("--tuned", type=Path, help="Tune folder whose drive rates the step bound uses")
    parser.add_argument(
        "--links", type=Path, help="`offloadlab plan --json` output from the run's machine: its links and machine"
    )
    args = parser.parse_args()
    console = Console(width=170)
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.store or args.out or Path(scratch) / "run"
        if args.store is None:
            subprocess.run(
                [sys.executable, "-m", "offloadlab.cli", "run", str(args.spec), "--out", str(run_dir)], check=True
            )
        rows = compare(
            args.spec,
            run_dir,
            console,
            args.tuned,
            gpus=args.gpus,
            gpu_mem_gib=args.gpu_mem,
            host_mem_gib=args.host_mem,
            links=load_links(args.links, args.tuned) if args.links else None,
            machine=load_machine(args.links) if args.links else None,
        )
    console.print(table(rows, f"plan accuracy: {args.spec}"))
    console.print(phase_table(rows, f"step by phase: {args.spec}"))
    if args.results:
        args.results.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
