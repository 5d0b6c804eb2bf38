"""What `offloadlab plan` shows and writes: the machine and its links, the ranked table (or its JSON), and the
chosen placement as a run spec, a DeepSpeed JSON and an Accelerate config for users' own scripts."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import tomli_w
from rich.table import Table

from offloadlab.checks.host import check_new_files
from offloadlab.engines import engine_for
from offloadlab.engines.deepspeed.buffers import SwapBuffers
from offloadlab.plan.accounting import GiB, Links, Machine, Placement, Shape, params_text
from offloadlab.plan.inputs import PlanInputs
from offloadlab.plan.predict import Prediction, usable, usable_text, why_not_runnable
from offloadlab.results.summary import Planned
from offloadlab.spec import RunSpec, SpecError, apply_tuned, load_spec, strategy_from_store


def plan_table(predictions: list[Prediction], title: str, machine: Machine) -> Table:
    """Placements, fastest fitting first, for 80 columns: "fits" names the constraint that binds (or all
    that break), the memory columns hold the needs (pinned host bytes are in --json and the breakdown), and
    the caption what a plan may fill of each."""
    judged = usable(machine).keys() | {name for x in predictions for name in x.constraints}
    names = [name for name in ("GPU memory", "host RAM", "NVMe space") if name in judged]
    caption = "a plan may fill: " + "; ".join(f"{name} {usable_text(name, machine)}" for name in names)
    table = Table(title=title, caption=caption, header_style="bold")
    table.add_column("strategy", overflow="fold", min_width=18)
    table.add_column("fits", no_wrap=True)
    for col in ("GPU\nGiB", "host\nGiB", "NVMe\nGiB"):
        table.add_column(col, justify="right")
    table.add_column("step s\n(bound by)", max_width=14)
    for i, x in enumerate(predictions):
        m = x.memory
        table.add_row(
            x.placement.name,
            f"[green]yes[/] ({x.binds})" if x.fits else f"[red]no[/]: {x.binds}",
            f"{m.gpu_bytes / GiB:.1f}",
            f"{m.host_bytes / GiB:.1f}",
            f"{m.nvme_bytes / GiB:.1f}",
            "-" if x.step is None else f"{x.step.seconds:.3g} {x.step.bottleneck}",
            style="bold green" if i == 0 and x.fits and x.step else ("dim" if not x.fits else ""),
        )
    return table


def machine_table(m: Machine, link: Links) -> Table:
    table = Table(title="machine and measured links", header_style="bold", show_header=False)
    table.add_column("what")
    table.add_column("value")
    gpu = (
        f"{m.gpus} x {m.gpu_name or 'GPU'}, {m.gpu_mem_bytes / GiB:.1f} GiB each"
        if m.gpu_mem_bytes
        else f"none: the CPU is the device ({m.gpus} rank(s))"
    )
    table.add_row("GPU", gpu)
    table.add_row("host RAM", f"{m.host_mem_bytes / GiB:.1f} GiB")
    table.add_row("NVMe free", "-" if m.nvme_free_bytes is None else f"{m.nvme_free_bytes / GiB:.1f} GiB")
    table.add_row(
        "NVMe read / write",
        "-"
        if link.nvme_read is None
        else f"{link.nvme_read / 1e9:.2f} / {link.nvme_write / 1e9:.2f} GB/s ({link.nvme_source})",
    )
    table.add_row(
        "PCIe pinned H2D / D2H",
        "-" if link.pcie_h2d is None else f"{link.pcie_h2d / 1e9:.1f} / {link.pcie_d2h / 1e9:.1f} GB/s",
    )
    table.add_row(
        "CPU Adam (DeepSpeed / torch)",
        f"{link.cpu_adam_params_per_s / 1e6:.0f} / {link.torch_cpu_adam_params_per_s / 1e6:.0f} M params/s",
    )
    table.add_row(
        "device Adam (torch / fused)",
        "- (no GPU here to measure: not in the predictions)"
        if link.device_adam_params_per_s is None
        else f"{link.device_adam_params_per_s / 1e6:.0f} / {link.device_fused_adam_params_per_s / 1e6:.0f} M params/s",
    )
    table.add_row("host passes (clip, fp32 -> 16-bit)", f"{link.host_passes_params_per_s / 1e6:.0f} M params/s")
    if link.converting_upload_params_per_s:  # measured only where there is a GPU
        table.add_row(
            "ZeRO-3 upload (pageable, converting)", f"{link.converting_upload_params_per_s / 1e6:.0f} M params/s"
        )
    table.add_row("compute", f"{link.flops_per_s / 1e12:.2f} TFLOP/s ({link.flops_source})")
    return table


def not_planned(inputs: PlanInputs) -> dict[str, str]:
    """The spec's strategies a run on this machine would refuse, each with why: the plan leaves them out."""
    reasons = {s.name: why_not_runnable(Placement(s), inputs.machine) for s in inputs.spec.strategy}
    return {name: why for name, why in reasons.items() if why}


def not_planned_text(inputs: PlanInputs) -> str | None:
    """One line a reason: "not planned on this machine: a, b: why"."""
    by_reason: dict[str, list[str]] = {}
    for name, why in not_planned(inputs).items():
        by_reason.setdefault(why, []).append(name)
    lines = [f"not planned on this machine: {', '.join(names)}: {why}" for why, names in by_reason.items()]
    return "\n".join(lines) or None


def plan_json(inputs: PlanInputs, predictions: list[Prediction]) -> dict:
    return {
        "not_planned": not_planned(inputs),
        "shape": asdict(inputs.shape),
        "machine": asdict(inputs.machine),
        "links": asdict(inputs.links),
        "predictions": [
            {
                "strategy": x.placement.name,
                "placement": x.placement.strategy.model_dump(),
                "activation_checkpointing": x.placement.activation_checkpointing,
                "fits": x.fits,
                "binding": x.binding,
                "gpu_bytes": x.memory.gpu_bytes,
                "host_bytes": x.memory.host_bytes,
                "pinned_bytes": x.memory.pinned_bytes,
                "nvme_bytes": x.memory.nvme_bytes,
                "memory": asdict(x.memory),
                "step_s": x.step.seconds if x.step else None,
                "bound_by": x.step.bottleneck if x.step else None,
                "bytes_per_step": x.step.bytes_moved if x.step else None,
            }
            for x in predictions
        ],
    }


def bindings_json(predictions: list[Prediction]) -> dict:
    return {"fits": any(x.fits for x in predictions), "bindings": {x.placement.name: x.binding for x in predictions}}


def past_the_largest(shape: Shape, past: list[Prediction], predictions: list[Prediction]) -> str:
    """One line for `plan --largest`: one more layer (which the search leaves fitting no placement), and
    what stops the first pick there."""
    pick = next((x for x in predictions if x.fits), None)
    there = next((x for x in past if pick and x.placement.name == pick.placement.name), None)
    return f"one more layer ({params_text(shape.n_params)}) fits no placement" + (
        f"; {there.placement.name} there: {there.binding}" if there else ""
    )


def breakdown_table(x: Prediction) -> Table:
    table = Table(title=f"{x.placement.name}: predicted bytes per rank", header_style="bold")
    for col in ("where", "what", "GiB"):
        table.add_column(col, justify="right" if col == "GiB" else "left")
    places = {
        "gpu": "gpu",
        "gpu_turn": "gpu (fwd/bwd turn)",
        "gpu_step": "gpu (optimizer step)",
        "host_pinned": "host pinned",
        "host_pageable": "host pageable",
        "nvme": "nvme",
    }
    for where, label in places.items():
        for what, nbytes in getattr(x.memory, where).items():
            table.add_row(label, what, f"{nbytes / GiB:.2f}")
    table.add_row("host", "runtime (Python, torch, CUDA)", f"{x.memory.runtime_bytes / GiB:.2f}")
    if x.memory.host_build_bytes:
        table.add_row(
            "host",
            "fp32 build copy (freed before training; peak is the larger phase)",
            f"{x.memory.host_build_bytes / GiB:.2f}",
        )
    return table


def run_spec_for(base: RunSpec, x: Prediction, tuned: Path | None, buffers: SwapBuffers) -> dict:
    """The base spec's fields with the chosen placement as its only strategy. A placement swapping its
    parameters gets the buffers it was planned with, unless a tune sized them (DeepSpeed's default 5 of
    1e8 elements stop a 1.42B GPT: its embedding is larger, and the turn holds 33)."""
    raw = json.loads(base.model_dump_json(exclude_none=True))
    strategy = x.placement.strategy.model_dump(mode="json", exclude_defaults=True)
    if tuned is not None and x.placement.strategy.uses_nvme:
        strategy["tuned"] = str(tuned.resolve())
    sized_by_tune = tuned is not None and "buffer_count" in apply_tuned({"tuned": str(tuned.resolve())}, Path("/"))
    if x.placement.strategy.swaps_parameters and not sized_by_tune:
        strategy |= {"buffer_count": buffers.param_buffer_count, "buffer_size": buffers.param_buffer_size}
    raw["strategy"] = [strategy]
    raw["model"]["activation_checkpointing"] = x.placement.activation_checkpointing
    raw["name"] = f"{base.name}-{x.placement.name}"
    return raw


def _accelerate_yaml(spec: RunSpec, engine_lines: list[str]) -> str:
    lines = [
        "# For `accelerate launch --config_file THIS your_script.py`, written by offloadlab plan.",
        "compute_environment: LOCAL_MACHINE",
        "machine_rank: 0",
        "num_machines: 1",
        f"num_processes: {spec.nproc}",
        "use_cpu: false",
        *engine_lines,
    ]
    return "\n".join(lines) + "\n"


def plan_files(x: Prediction, out_dir: Path) -> list[Path]:
    """What `plan --write` writes for a placement: its run spec, the engine's own files and the
    Accelerate config."""
    name = x.placement.name
    engine_files = engine_for(x.placement.strategy).exporter.file_names(name)
    return [out_dir / n for n in (f"{name}.toml", *engine_files, f"{name}_accelerate.yaml")]


def write_plan(
    x: Prediction,
    base: RunSpec,
    out_dir: Path,
    tuned: Path | None,
    buffers: SwapBuffers,
    force: bool,
    why: str | None = None,
) -> list[Path]:
    """The files of plan_files; force: overwrite files of those names the folder holds (the user's, or an
    earlier plan's). why: the spec's first line (default: the plan's pick and what binds it)."""
    files = plan_files(x, out_dir)
    check_new_files(out_dir, [path.name for path in files], force)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path, *_, accelerate = files
    raw = run_spec_for(base, x, tuned, buffers)
    why = why or f"Written by offloadlab plan: {x.placement.name} ({x.binding})"
    spec_path.write_text(f"# {why}\n" + tomli_w.dumps(raw))
    spec = load_spec(spec_path)  # the written spec is one `offloadlab run` accepts, tuned include and all
    engine_lines = engine_for(x.placement.strategy).exporter.export(spec, out_dir, x.placement.name)
    accelerate.write_text(_accelerate_yaml(spec, engine_lines))
    return files


def planned_for_spec(path: Path, spec: RunSpec, shape: Shape) -> dict[str, Planned]:
    """Each strategy's predictions from `offloadlab plan SPEC --json` output, for `run --plan`: the plan must
    be of this spec's model and batch and name every strategy the spec runs."""
    remake = f"write it with 'offloadlab plan SPEC --json > {path}'"
    try:
        raw = json.loads(Path(path).read_text())
        planned_shape, links = raw["shape"], raw["links"]
        predictions = raw["predictions"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SpecError(f"--plan {path} is not the JSON of 'offloadlab plan --json' ({err}): {remake}") from None
    asked = {
        k: getattr(shape, k) for k in ("n_layers", "d_model", "vocab_size", "seq_len", "micro_batch", "grad_accum")
    }
    differs = {k: (planned_shape.get(k), v) for k, v in asked.items() if planned_shape.get(k) != v}
    if differs:
        said = ", ".join(f"{k} {a} in the plan, {b} here" for k, (a, b) in differs.items())
        raise SpecError(f"--plan {path} is of another model or batch ({said}): {remake}")
    found = {s.name: _prediction_of(s, spec.model.activation_checkpointing, predictions) for s in spec.strategy}
    missing = [name for name, x in found.items() if x is None]
    if missing:
        raise SpecError(f"--plan {path} has no prediction for {', '.join(missing)}: {remake}")
    link = (links["pcie_h2d"] / 1e9, links["pcie_d2h"] / 1e9) if links["pcie_h2d"] and links["pcie_d2h"] else None
    return {
        # plans written before the step was calibrated (session 15) call it a bound: step_bound_s
        name: Planned(x.get("step_s", x.get("step_bound_s")), x["bound_by"], x["gpu_bytes"], x["host_bytes"], link)
        for name, x in found.items()
    }


def _prediction_of(strategy, activation_checkpointing: bool, predictions: list[dict]) -> dict | None:
    """The plan lists a spec's strategy under a candidate's name when it is that candidate in all but name."""
    settings = strategy.model_dump(exclude={"name"})
    for x in predictions:
        # Read as a strategy: a plan written before a field existed has it at its default.
        planned = strategy_from_store(x["placement"])
        same = planned is not None and planned.model_dump(exclude={"name"}) == settings
        if x["strategy"] == strategy.name or (same and x["activation_checkpointing"] == activation_checkpointing):
            return x
    return None
