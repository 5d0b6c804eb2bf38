"""`offloadlab plan`: predicted memory per rank and a step-time lower bound for every placement, ranked.

Each engine's planner (`engines/<name>/planner.py`, found through the registry) says what it keeps where and
moves over which link; this module adds what every placement shares (activations, the machine's
constraints, the step's overlap) and picks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from offloadlab.engines import ENGINES, engine_for
from offloadlab.engines.deepspeed.buffers import SwapBuffers, buffers_for
from offloadlab.plan.accounting import (
    GPU_USABLE_SHARE,
    HOST_BASELINE_CUDA_BYTES,
    HOST_RESERVED_BYTES,
    GiB,
    Links,
    Machine,
    Memory,
    Placement,
    Shape,
    StepPrediction,
    activation_bytes,
    pinned_rounding_bytes,
)
from offloadlab.results.figures import flops_per_token
from offloadlab.workload.model import GPTConfig


def candidate_placements() -> list[Placement]:
    """Every exact placement offloadlab can run, each engine's in the registry's order."""
    return [p for record in ENGINES for p in record.placements.candidates()]


def why_not_runnable(p: Placement, machine: Machine) -> str | None:
    """Why a run on this machine would refuse the placement: it needs CUDA where no GPU is planned for, it
    trains on one GPU where there are several, or its engine's package is missing; None if it would not."""
    if machine.gpu_mem_bytes is None and p.strategy.needs_cuda:
        return p.strategy.needs_cuda
    if machine.gpus > 1 and p.strategy.single_gpu:
        return "it trains on one GPU only"
    if not engine_for(p.strategy).installed:
        return f"its package is not installed (pip install 'offloadlab[{engine_for(p.strategy).extra}]')"
    return None


def runnable(placements: list[Placement], machine: Machine) -> list[Placement]:
    return [p for p in placements if why_not_runnable(p, machine) is None]


def predict_memory(
    p: Placement,
    shape: Shape,
    world: int,
    buffers: SwapBuffers | None = None,
    on_gpu: bool = True,
    pinned_exact: bool = True,
) -> Memory:
    engine = engine_for(p.strategy).planner
    m = engine.memory(p, shape, world, buffers, on_gpu)
    m.add("gpu_turn", "activations", activation_bytes(shape, p.activation_checkpointing))
    if on_gpu:
        m.runtime_bytes = HOST_BASELINE_CUDA_BYTES
        if not pinned_exact:
            rounding = pinned_rounding_bytes(engine.pinned_buffers(p, shape, world, buffers))
            m.add("host_pinned", "torch's pinned rounding (powers of two)", rounding)
    return m


def predict_step(p: Placement, shape: Shape, world: int, links: Links) -> StepPrediction:
    """The step predicted from the links' rates and the overheads measured on the H200 hosts: compute (at
    the measured block rate), PCIe and parameter fetches overlap in forward and backward, and the host work
    they wait on (DeepSpeed's gradient hand-off, the engines' hooks) adds to them; the optimizer phase
    follows backward: Adam where the optimizer lives, on the host with the passes around it (or the NVMe
    swap where that is longer) and the updated parameters' upload. An engine that runs part of its optimizer
    beside the next steps' training (ZenFlow) has that part in the overlapped maximum instead."""
    engine = engine_for(p.strategy).planner
    moved = engine.step_bytes(p, shape, world)
    tokens = shape.seq_len * shape.micro_batch * shape.grad_accum
    flops = flops_per_token(shape.n_params, shape.n_layers, shape.d_model, shape.seq_len) * tokens
    if p.activation_checkpointing:
        flops *= 4 / 3  # forward once more
    parts = {"compute": flops / links.flops_per_s}
    upload = engine.param_upload_bytes(p, shape, world)
    if links.pcie_h2d:
        parts["pcie_h2d"] = (moved["pcie_h2d"] - upload) / links.pcie_h2d
        parts["pcie_d2h"] = moved["pcie_d2h"] / links.pcie_d2h
    param_nvme = engine.param_nvme_read_bytes(p, shape, world)
    if p.strategy.uses_nvme:
        if links.nvme_read is None:
            raise ValueError("an NVMe placement needs measured NVMe bandwidth")
        parts["nvme_params"] = param_nvme / links.nvme_read
    optimizer = engine.optimizer_phase(p, shape, world, links, moved["nvme_read"] - param_nvme, moved["nvme_write"])
    concurrent = engine.overlapped_with_training(p)
    serial = engine.serial_in_training(p, shape, world, links)
    training = max(*parts.values(), sum(v for k, v in optimizer.items() if k in concurrent)) + sum(serial.values())
    parts.update(serial)
    parts.update(optimizer)
    after = {k: v for k, v in optimizer.items() if k not in concurrent}  # what follows backward
    host = after.get("cpu_adam", 0.0) + after.get("host_passes", 0.0)
    seconds = (
        training
        + max(host, after.get("nvme_optimizer", 0.0))
        + after.get("device_adam", 0.0)
        + after.get("param_upload", 0.0)
    )
    bottleneck = max(parts, key=parts.get)
    return StepPrediction(seconds, bottleneck, parts, moved, training)


@dataclass(frozen=True)
class Prediction:
    placement: Placement
    memory: Memory
    fits: bool
    binding: str
    """The constraints that fail, or the tightest one when all hold."""
    step: StepPrediction | None
    use: float
    """The tightest constraint's need over what it has: at most 1 where the placement fits."""
    constraints: tuple[str, ...]
    """The names of those in `binding`, the worst first: "GPU memory", "host RAM", "NVMe space"."""
    short_bytes: tuple[float, ...] = ()
    """For each of `constraints` where the placement does not fit: the bytes more it would need."""

    @property
    def binds(self) -> str:
        """`constraints` in a table's few columns: "GPU, host"."""
        return ", ".join(name.split(" ")[0] for name in self.constraints)


def usable(machine: Machine) -> dict[str, float]:
    """What a plan may fill of each of this machine's memories, per host."""
    out = {"host RAM": max(0.0, machine.host_mem_bytes - HOST_RESERVED_BYTES)}
    if machine.gpu_mem_bytes is not None:
        out["GPU memory"] = GPU_USABLE_SHARE * machine.gpu_mem_bytes
    if machine.nvme_free_bytes is not None:
        out["NVMe space"] = machine.nvme_free_bytes
    return out


def usable_text(constraint: str, machine: Machine) -> str:
    """How much of `constraint` a plan may fill, and why that much."""
    text = f"{usable(machine).get(constraint, 0.0) / GiB:.1f} GiB"
    if constraint == "GPU memory":
        text += f" usable ({GPU_USABLE_SHARE:.0%} of {machine.gpu_mem_bytes / GiB:.1f})"
    if constraint == "host RAM":
        text += f" usable ({machine.host_mem_bytes / GiB:.1f} less {HOST_RESERVED_BYTES / GiB:.0f} for the launcher)"
    if constraint == "NVMe space" and machine.nvme_free_bytes is None:
        text += " (no NVMe folder given: --nvme, or nvme_path in the spec)"
    return text


def _constraints(m: Memory, machine: Machine, world: int, uses_nvme: bool) -> dict[str, tuple[float, float]]:
    """name -> (needed, usable), per host."""
    have = usable(machine)
    # No GPU: "device" memory is host RAM too.
    host_need = m.host_bytes + (m.gpu_bytes if machine.gpu_mem_bytes is None else 0.0)
    out = {"host RAM": (host_need * world, have["host RAM"])}
    if machine.gpu_mem_bytes is not None:
        out["GPU memory"] = (m.gpu_bytes, have["GPU memory"])
    # An NVMe placement needs a folder even where nothing is swapped (a model whose parameters all stay
    # resident under ZeRO-3's persistence threshold): DeepSpeed's swapper is made at start either way.
    if m.nvme_bytes or uses_nvme:
        out["NVMe space"] = (m.nvme_bytes, have.get("NVMe space", 0.0))
    return out


def _usage(constraint: str, needed: float, machine: Machine) -> str:
    return f"{constraint}: {needed / GiB:.1f} of {usable_text(constraint, machine)}"


def predict(
    p: Placement, shape: Shape, machine: Machine, links: Links | None, buffers: SwapBuffers | None = None
) -> Prediction:
    world = max(1, machine.gpus)
    m = predict_memory(p, shape, world, buffers, machine.gpu_mem_bytes is not None, machine.pinned_exact)
    constraints = _constraints(m, machine, world, p.strategy.uses_nvme)
    use = {k: need / have if have else math.inf for k, (need, have) in constraints.items()}
    tightest = sorted(use, key=use.get, reverse=True)
    fits = use[tightest[0]] <= 1.0
    # What does not fit names every constraint it breaks, the worst first: one layer past the largest GPT
    # under a 24 GiB budget broke the GPU share and host RAM both, and host RAM is what ended it on the H200.
    broken = tightest[:1] if fits else [k for k in tightest if use[k] > 1.0]
    binding = "; ".join(_usage(k, constraints[k][0], machine) for k in broken)
    usable_links = links is not None and (links.nvme_read or not p.strategy.uses_nvme)
    step = predict_step(p, shape, world, links) if usable_links else None
    short = () if fits else tuple(constraints[k][0] - constraints[k][1] for k in broken)
    return Prediction(p, m, fits, binding, step, use[tightest[0]], tuple(broken), short)


def plan(
    shape: Shape,
    machine: Machine,
    links: Links | None,
    buffers: SwapBuffers | None = None,
    also: tuple[Placement, ...] = (),
) -> list[Prediction]:
    """Every placement, with and without activation checkpointing where the plain one does not fit, plus a
    partial optimizer offload (ratio) when the GPU can hold part of the optimizer; feasible ones fastest first.
    `also`: placements a spec names beyond the candidates (ZenFlow, SuperOffload, tuned variants)."""
    out = []
    for p in runnable(candidate_placements() + list(also), machine):
        pred = predict(p, shape, machine, links, buffers)
        if not pred.fits:
            checkpointed = predict(
                p.varied(f"{p.name}+ac", activation_checkpointing=True), shape, machine, links, buffers
            )
            pred = checkpointed if checkpointed.fits else pred
        if not pred.fits and pred.constraints[0] == "host RAM":
            pred = (
                _first_fitting(
                    engine_for(p.strategy).placements.when_host_ram_binds(p), shape, machine, links, buffers
                )
                or pred
            )
        out.append(pred)
        # Keeping part of the optimizer on a GPU with room to spare speeds a fitting placement up, and
        # rescues one that host RAM cannot hold.
        if (pred.fits or pred.constraints[0] == "host RAM") and machine.gpu_mem_bytes is not None:
            world = max(1, machine.gpus)
            spare = usable(machine)["GPU memory"] - pred.memory.gpu_bytes
            partial = engine_for(p.strategy).placements.partial_offloads(pred.placement, shape, world, spare)
            out += [x for x in [_first_fitting(partial, shape, machine, links, buffers)] if x is not None]
    feasible = sorted((x for x in out if x.fits and x.step), key=lambda x: x.step.seconds)
    return feasible + [x for x in out if not (x.fits and x.step)]


def _first_fitting(
    placements: list[Placement], shape: Shape, machine: Machine, links: Links | None, buffers: SwapBuffers | None
) -> Prediction | None:
    for p in placements:
        pred = predict(p, shape, machine, links, buffers)
        if pred.fits:
            return pred
    return None


def why_winner(predictions: list[Prediction]) -> str:
    feasible = [x for x in predictions if x.fits and x.step]
    if not feasible:
        tight = min(predictions, key=lambda x: x.memory.gpu_bytes)
        return f"nothing fits: the smallest placement, {tight.placement.name}, needs {tight.binding}. " + _nearest(
            predictions
        )
    win = feasible[0]
    text = (
        f"{win.placement.name} wins: it fits ({win.binding}) and its predicted step is {win.step.seconds:.3g} s, "
        f"set by {win.step.bottleneck} ({win.step.parts[win.step.bottleneck]:.3g} s)"
    )
    if len(feasible) > 1:
        second = feasible[1]
        text += (
            f"; next is {second.placement.name} at {second.step.seconds:.3g} s/step, bound by {second.step.bottleneck}"
        )
    faster_unfit = [x for x in predictions if not x.fits and x.step and x.step.seconds < win.step.seconds]
    if faster_unfit:
        text += "; faster but not fitting: " + ", ".join(f"{x.placement.name} ({x.binding})" for x in faster_unfit[:3])
    return text


def _nearest(predictions: list[Prediction]) -> str:
    """What would make the placement nearest to fitting fit (the fewest GiB short), or a smaller model."""
    nearest = min(predictions, key=lambda x: sum(x.short_bytes))
    more = [
        f"{short / GiB:.1f} GiB more {name}" + (" (--nvme on a drive with room)" if name == "NVMe space" else "")
        for name, short in zip(nearest.constraints, nearest.short_bytes)
    ]
    return (
        f"Nearest to fitting: {nearest.placement.name}, with {' and '.join(more)}; or a smaller model "
        "(offloadlab plan --largest names the largest GPT that fits)"
    )


def largest_model(
    presets: dict[str, GPTConfig], shape_of, machine: Machine, links: Links | None
) -> tuple[GPTConfig, str] | None:
    """The largest GPT some placement fits: the biggest preset that fits, then, at its width and at the next
    preset's, as many layers as still fit (bisection on n_layers); the larger of the two wins. One more layer
    at the winner's width does not fit. `shape_of(cfg)` gives a Shape at the run's batch.
    Returns (config, how it was found), or None when not even the smallest preset fits."""

    def fits(cfg: GPTConfig) -> bool:
        shape = shape_of(cfg)
        return any(x.fits for x in plan(shape, machine, links, buffers_for(shape)))

    ordered = sorted(presets.items(), key=lambda kv: kv[1].n_params)
    fitting = [(name, cfg) for name, cfg in ordered if fits(cfg)]
    if not fitting:
        return None
    name, preset = fitting[-1]
    best, found = preset, f"preset {name}"
    bigger = [(n, cfg) for n, cfg in ordered if cfg.n_params > preset.n_params]
    for width_name, width in [(name, preset), *bigger[:1]]:
        cfg = replace(width, n_layers=_most_layers(width, fits))
        if cfg.n_layers and cfg.n_params > best.n_params:
            best, found = cfg, f"{width_name}'s width with {cfg.n_layers} layers (the preset has {width.n_layers})"
    return best, found


def one_more_layer(cfg: GPTConfig, shape_of, machine: Machine, links: Links | None) -> tuple[Shape, list[Prediction]]:
    """The plan for cfg with one more layer: past `plan --largest`'s pick, where each placement stops fitting."""
    shape = shape_of(replace(cfg, n_layers=cfg.n_layers + 1))
    return shape, plan(shape, machine, links, buffers_for(shape))


def _most_layers(cfg: GPTConfig, fits) -> int:
    """The most layers of cfg's width that fit (0 if not one does): double until one does not, then bisect."""
    low, high = 0, cfg.n_layers
    while fits(replace(cfg, n_layers=high)):
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(replace(cfg, n_layers=mid)) else (low, mid)
    return low
