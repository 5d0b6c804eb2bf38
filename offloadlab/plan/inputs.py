"""What `offloadlab plan` plans for: the model and batch (a spec or a preset), this machine (detected
unless given) and the link rates (measured here unless given)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
from rich.console import Console

from offloadlab.checks.host import pinned_sizes_exact
from offloadlab.engines.deepspeed.buffers import SwapBuffers, buffers_for, swap_buffers_of
from offloadlab.measure.links import measure_block_flops, nvme_from_tune_store
from offloadlab.plan.accounting import (
    GiB,
    Links,
    Machine,
    Placement,
    Shape,
    compute_stand_in,
    params_text,
    shape_of_spec,
)
from offloadlab.plan.link_rates import BLOCK_MEASURED, GIVEN_FLOPS, measure_links
from offloadlab.plan.predict import candidate_placements
from offloadlab.results.store import DB_NAME
from offloadlab.spec import ModelSpec, RunSpec, SpecError, load_spec, parse_spec
from offloadlab.workload.hf import check_hf_model, hf_folder
from offloadlab.workload.model import PRESETS, GPTConfig, gpt3_learning_rate


@dataclass(frozen=True)
class PlanRequest:
    """What `offloadlab plan` was asked for; None: take it from the spec, detect it or measure it here."""

    spec_path: Path | None = None
    preset: str | None = None
    """A GPT preset to plan without a spec, at the batch below."""
    seq_len: int = 1024
    micro_batch: int = 4
    grad_accum: int = 1
    precision: str = "bf16"
    gpus: int | None = None
    gpu_mem_gib: float | None = None
    """0: plan for no GPU (the CPU is the device)."""
    host_mem_gib: float | None = None
    nvme_path: Path | None = None
    tuned_dir: Path | None = None
    """An `offloadlab tune` folder whose drive rates to use; None: the newest under runs/."""
    tflops: float | None = None
    pcie_gbps: float | None = None


def _newest_tune(root: Path = Path("runs")) -> Path | None:
    if not root.is_dir():
        return None
    tunes = sorted((p for p in root.glob("tune-*") if (p / DB_NAME).is_file()), key=lambda p: p.stat().st_mtime)
    return next((p for p in reversed(tunes) if nvme_from_tune_store(p)), None)


def _shape(spec: RunSpec, cfg: GPTConfig) -> Shape:
    return Shape.of(cfg, spec.seq_len, spec.micro_batch, spec.grad_accum, spec.precision)


def _model_label(spec: RunSpec) -> str:
    if spec.model.is_hf:
        return f"{hf_folder(spec.model.hf_path).name} ({'its weights' if spec.model.hf_model else 'random weights'})"
    return spec.model.preset or "custom"


def detect_machine(
    gpus: int | None, gpu_mem_gib: float | None, host_mem_gib: float | None, nvme_path: Path | None
) -> Machine:
    import torch

    cuda = torch.cuda.is_available() and gpu_mem_gib != 0
    detected_gpus = torch.cuda.device_count() if cuda else 1
    gpu_mem = None
    name = None
    if cuda:
        gpu_mem = gpu_mem_gib * GiB if gpu_mem_gib else torch.cuda.mem_get_info(0)[1]
        name = torch.cuda.get_device_name(0)
    elif gpu_mem_gib:
        gpu_mem = gpu_mem_gib * GiB  # planning for a GPU this machine does not have
    host = host_mem_gib * GiB if host_mem_gib else psutil.virtual_memory().available
    nvme_free = shutil.disk_usage(nvme_path).free if nvme_path is not None and nvme_path.is_dir() else None
    return Machine(gpus or detected_gpus, gpu_mem, host, nvme_free, name, pinned_sizes_exact(os.environ))


@dataclass
class PlanInputs:
    spec: RunSpec
    shape: Shape
    machine: Machine
    links: Links
    buffers: SwapBuffers
    tuned_fragment: Path | None
    model_label: str
    """How the model is named in the title: its preset, or how `plan --largest` found it."""

    @property
    def spec_placements(self) -> tuple[Placement, ...]:
        """The spec's own strategies that no candidate placement already is (by everything but the name)."""
        candidates = [p.strategy.model_dump(exclude={"name"}) for p in candidate_placements()]
        return tuple(
            Placement(s, self.spec.model.activation_checkpointing)
            for s in self.spec.strategy
            if s.model_dump(exclude={"name"}) not in candidates
        )

    @classmethod
    def gather(cls, request: PlanRequest, console: Console, links: Links | None = None) -> "PlanInputs":
        """links: those measured on the machine planned for (`plan --json`'s); None: measured here now."""
        r = request
        if r.spec_path is None and r.preset is None:
            raise SpecError("plan needs a SPEC or --model PRESET")
        if r.spec_path is not None:
            spec = load_spec(r.spec_path)
        else:
            spec = parse_spec(
                dict(
                    name=r.preset,
                    seq_len=r.seq_len,
                    micro_batch=r.micro_batch,
                    grad_accum=r.grad_accum,
                    precision=r.precision,
                    nproc=r.gpus or 1,
                    model=dict(preset=r.preset),
                    # an unknown preset is the spec check's to name
                    **({"lr": gpt3_learning_rate(PRESETS[r.preset].n_params)} if r.preset in PRESETS else {}),
                    **({"nvme_path": str(r.nvme_path)} if r.nvme_path else {}),
                    strategy=[dict(name="planned", engine="fsdp2")],
                ),
                "--model",
            )
        if r.gpu_mem_gib:  # planned for a GPU of this size: the spec `--write` emits is held to it
            spec = spec.model_copy(update={"gpu_memory_limit_gib": r.gpu_mem_gib})
        nvme_path = r.nvme_path or (spec.nvme_path if r.spec_path is not None else None)
        if spec.model.is_hf:  # what `run` refuses, the plan refuses too
            check_hf_model(spec.model, reads_text=spec.data.kind == "text")
        cfg = compute_stand_in(spec)
        shape = shape_of_spec(spec)
        gpus = r.gpus or (spec.nproc if r.spec_path else None)
        # --gpu-mem 0 (no GPU) wins over the spec's budget; once given, the spec already holds any other size.
        gpu_mem_gib = 0 if r.gpu_mem_gib == 0 else spec.gpu_memory_limit_gib
        machine = detect_machine(gpus, gpu_mem_gib, r.host_mem_gib, nvme_path)
        tuned_dir = r.tuned_dir or _newest_tune()
        given_flops_per_s = r.tflops * 1e12 if r.tflops else None
        if given_flops_per_s is None and machine.gpu_mem_bytes is not None and machine.gpu_name is None:
            console.print(
                "warning: planning for a GPU this machine lacks: step times come from this CPU's rate on one "
                "block; pass --tflops (the GPU's) for the GPU's",
                style="yellow",
            )
        links = links or measure_links(spec, cfg, machine, nvme_path, tuned_dir, console, given_flops_per_s)
        if given_flops_per_s:  # links passed in were measured for another request
            links = replace(links, flops_per_s=given_flops_per_s, flops_source=GIVEN_FLOPS)
        if r.pcie_gbps:
            links = replace(links, pcie_h2d=r.pcie_gbps * 1e9, pcie_d2h=r.pcie_gbps * 1e9)
        nvme = next((s for s in spec.strategy if s.swaps_parameters), None)
        buffers = swap_buffers_of(nvme, shape)
        fragment = tuned_dir / "tuned.toml" if tuned_dir and (tuned_dir / "tuned.toml").is_file() else None
        return cls(spec, shape, machine, links, buffers, fragment, _model_label(spec))

    def with_model(self, cfg: GPTConfig, what: str) -> "PlanInputs":
        """The same machine, links and batch for another GPT shape, as an explicit model in the spec."""
        model = dict(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, vocab_size=cfg.vocab_size)
        name = f"largest-{cfg.n_params / 1e9:.1f}b"
        spec = self.spec.model_copy(
            update={"model": ModelSpec(**model), "name": name, "lr": gpt3_learning_rate(cfg.n_params)}
        )
        shape = self.shape_of(cfg)
        label = f"{what}, d {cfg.d_model} x {cfg.n_layers} layers"
        links = self.links
        if links.flops_source == BLOCK_MEASURED:  # the rate depends on the block's width
            s = self.spec
            links = replace(links, flops_per_s=measure_block_flops(cfg, s.seq_len, s.micro_batch, s.precision))
        return replace(self, spec=spec, shape=shape, buffers=buffers_for(shape), model_label=label, links=links)

    def shape_of(self, cfg: GPTConfig) -> Shape:
        return _shape(self.spec, cfg)

    @property
    def title(self) -> str:
        s = self.spec
        return (
            f"{self.model_label} ({params_text(self.shape.n_params)}), seq {s.seq_len}, "
            f"micro-batch {s.micro_batch} x {s.grad_accum}, {s.precision}, {self.machine.gpus} rank(s)"
        )
