"""What `offloadlab plan` plans for: the model and batch (a spec or a preset), this machine (detected
unless given) and the measured link speeds."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from offloadlab.measure import links as measure
from offloadlab.workload.model import GPTConfig, gpt_config
from offloadlab.engines.ops import announce_on, ensure_built
from offloadlab.plan.predict import GiB, Links, Machine, Prediction, Shape, SwapBuffers, buffers_for
from offloadlab.spec import DeepSpeedStrategy, ModelSpec, RunSpec, SpecError, load_spec, parse_spec
from offloadlab.results.store import DB_NAME

BLOCK_MEASURED = "one block's forward and backward, measured now"


def _newest_tune(root: Path = Path("runs")) -> Path | None:
    if not root.is_dir():
        return None
    tunes = sorted((p for p in root.glob("tune-*") if (p / DB_NAME).is_file()), key=lambda p: p.stat().st_mtime)
    return next((p for p in reversed(tunes) if measure.nvme_from_tune_store(p)), None)


def swap_buffers_of(strategy, shape: Shape) -> SwapBuffers:
    """The parameter swap buffers a strategy asks for when it swaps parameters to NVMe, else DeepSpeed's
    defaults widened to the largest parameter."""
    if isinstance(strategy, DeepSpeedStrategy) and strategy.offload_param == "nvme":
        return SwapBuffers(strategy.buffer_count, strategy.buffer_size, strategy.optimizer_buffer_count)
    return buffers_for(shape)


def _shape(spec: RunSpec, cfg: GPTConfig) -> Shape:
    return Shape.of(cfg, spec.seq_len, spec.micro_batch, spec.grad_accum, spec.precision)


def detect_machine(gpus: int | None, gpu_mem_gib: float | None, host_mem_gib: float | None,
                   nvme_path: Path | None) -> Machine:
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
    return Machine(gpus or detected_gpus, gpu_mem, host, nvme_free, name)


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

    @classmethod
    def gather(cls, spec_path: Path | None, preset: str | None, seq_len: int, micro_batch: int, grad_accum: int,
               precision: str, gpus: int | None, gpu_mem_gib: float | None, host_mem_gib: float | None,
               nvme_path: Path | None, tuned_dir: Path | None, console: Console, tflops: float | None = None,
               pcie_gbps: float | None = None, links: Links | None = None) -> "PlanInputs":
        """links: those measured on the machine planned for (`plan --json`'s); None: measured here now."""
        if spec_path is None and preset is None:
            raise SpecError("plan needs a SPEC or --model PRESET")
        if spec_path is not None:
            spec = load_spec(spec_path)
        else:
            spec = parse_spec(dict(name=preset, seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum,
                                   precision=precision, nproc=gpus or 1, model=dict(preset=preset),
                                   **({"nvme_path": str(nvme_path)} if nvme_path else {}),
                                   strategy=[dict(name="planned", engine="fsdp2")]), "--model")
        if spec.model.hf_config is not None:
            raise SpecError("plan predicts GPT presets and shapes (model.preset or d_model/n_layers/...); "
                            "for an hf_config model, give the matching GPT shape")
        nvme_path = nvme_path or (spec.nvme_path if spec_path is not None else None)
        cfg = gpt_config(spec.model, spec.seq_len)
        shape = _shape(spec, cfg)
        machine = detect_machine(gpus or (spec.nproc if spec_path else None), gpu_mem_gib, host_mem_gib, nvme_path)
        tuned_dir = tuned_dir or _newest_tune()
        links = links or cls._links(spec, cfg, machine, nvme_path, tuned_dir, console)
        if tflops:
            links = replace(links, flops_per_s=tflops * 1e12, flops_source="given with --tflops")
        if pcie_gbps:
            links = replace(links, pcie_h2d=pcie_gbps * 1e9, pcie_d2h=pcie_gbps * 1e9)
        nvme = next((s for s in spec.strategy if isinstance(s, DeepSpeedStrategy) and s.offload_param == "nvme"), None)
        buffers = swap_buffers_of(nvme, shape)
        fragment = tuned_dir / "tuned.toml" if tuned_dir and (tuned_dir / "tuned.toml").is_file() else None
        return cls(spec, shape, machine, links, buffers, fragment, spec.model.preset or "custom")

    @classmethod
    def for_spec(cls, spec_path: Path, console: Console, tuned_dir: Path | None = None) -> "PlanInputs":
        """This machine as detected, the spec's model, batch, ranks and NVMe path (drive rates from
        tuned_dir's tune results, else the newest under runs/, else a quick measurement)."""
        return cls.gather(spec_path, None, 0, 0, 0, "bf16", None, None, None, None, tuned_dir, console)

    @staticmethod
    def _links(spec: RunSpec, cfg: GPTConfig, machine: Machine, nvme_path: Path | None, tuned_dir: Path | None,
               console: Console) -> Links:
        ensure_built(("cpu_adam", "async_io") if nvme_path is not None else ("cpu_adam",), announce_on(console))
        with console.status("measuring links: PCIe copy, Adam on CPU (DeepSpeed's op) and device, host passes, "
                            "one block's forward and backward, NVMe"):
            pcie = measure.measure_pinned_copy()
            nvme = measure.nvme_from_tune_store(tuned_dir) if tuned_dir else None
            if nvme is None and nvme_path is not None:
                nvme = measure.measure_nvme_quick(nvme_path)
            torch_cpu_adam = measure.measure_adam_params_per_s("torch")
            if pcie:
                device_adam = (measure.measure_adam_params_per_s("torch", "cuda"),
                               measure.measure_adam_params_per_s("fused", "cuda"))
            elif machine.gpu_mem_bytes is None:  # the CPU is the device
                device_adam = (torch_cpu_adam, measure.measure_adam_params_per_s("fused"))
            else:  # planning for a GPU this machine lacks: its CPU's Adam says nothing of that GPU's
                device_adam = (None, None)
            return Links(
                nvme_read=nvme[0] if nvme else None, nvme_write=nvme[1] if nvme else None,
                nvme_source=nvme[2] if nvme else "no --nvme given: NVMe placements get no step bound",
                pcie_h2d=pcie.host_to_device_gbps * 1e9 if pcie else None,
                pcie_d2h=pcie.device_to_host_gbps * 1e9 if pcie else None,
                cpu_adam_params_per_s=measure.measure_adam_params_per_s("deepspeed-cpu"),
                torch_cpu_adam_params_per_s=torch_cpu_adam,
                device_adam_params_per_s=device_adam[0], device_fused_adam_params_per_s=device_adam[1],
                host_passes_params_per_s=measure.measure_host_passes_params_per_s(),
                flops_per_s=measure.measure_block_flops(cfg, spec.seq_len, spec.micro_batch, spec.precision),
                flops_source=BLOCK_MEASURED,
            )

    def with_model(self, cfg: GPTConfig, what: str) -> "PlanInputs":
        """The same machine, links and batch for another GPT shape, as an explicit model in the spec."""
        model = dict(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, vocab_size=cfg.vocab_size)
        spec = self.spec.model_copy(update={"model": ModelSpec(**model), "name": f"largest-{cfg.n_params / 1e9:.1f}b"})
        shape = self.shape_of(cfg)
        label = f"{what}, d {cfg.d_model} x {cfg.n_layers} layers"
        links = self.links
        if links.flops_source == BLOCK_MEASURED:  # the rate depends on the block's width
            s = self.spec
            links = replace(links, flops_per_s=measure.measure_block_flops(cfg, s.seq_len, s.micro_batch, s.precision))
        return replace(self, spec=spec, shape=shape, buffers=buffers_for(shape), model_label=label, links=links)

    def shape_of(self, cfg: GPTConfig) -> Shape:
        return _shape(self.spec, cfg)

    @property
    def title(self) -> str:
        s = self.spec
        return f"{self.model_label} ({self.shape.n_params / 1e9:.2f}B params), seq {s.seq_len}, " \
               f"micro-batch {s.micro_batch} x {s.grad_accum}, {s.precision}, {self.machine.gpus} rank(s)"

    def machine_table(self) -> Table:
        m, link = self.machine, self.links
        table = Table(title="machine and measured links", header_style="bold", show_header=False)
        table.add_column("what")
        table.add_column("value")
        gpu = f"{m.gpus} x {m.gpu_name or 'GPU'}, {m.gpu_mem_bytes / GiB:.1f} GiB each" if m.gpu_mem_bytes else \
            f"none: the CPU is the device ({m.gpus} rank(s))"
        table.add_row("GPU", gpu)
        table.add_row("host RAM", f"{m.host_mem_bytes / GiB:.1f} GiB")
        table.add_row("NVMe free", "-" if m.nvme_free_bytes is None else f"{m.nvme_free_bytes / GiB:.1f} GiB")
        table.add_row("NVMe read / write", "-" if link.nvme_read is None else
                      f"{link.nvme_read / 1e9:.2f} / {link.nvme_write / 1e9:.2f} GB/s ({link.nvme_source})")
        table.add_row("PCIe pinned H2D / D2H", "-" if link.pcie_h2d is None else
                      f"{link.pcie_h2d / 1e9:.1f} / {link.pcie_d2h / 1e9:.1f} GB/s")
        table.add_row("CPU Adam (DeepSpeed / torch)", f"{link.cpu_adam_params_per_s / 1e6:.0f} / "
                      f"{link.torch_cpu_adam_params_per_s / 1e6:.0f} M params/s")
        table.add_row("device Adam (torch / fused)", "- (no GPU here to measure: not in the bounds)"
                      if link.device_adam_params_per_s is None else f"{link.device_adam_params_per_s / 1e6:.0f} / "
                      f"{link.device_fused_adam_params_per_s / 1e6:.0f} M params/s")
        table.add_row("host passes (clip, fp32 -> 16-bit)", f"{link.host_passes_params_per_s / 1e6:.0f} M params/s")
        table.add_row("compute", f"{link.flops_per_s / 1e12:.2f} TFLOP/s ({link.flops_source})")
        return table

    def as_json(self, predictions: list[Prediction]) -> dict:
        return {
            "shape": asdict(self.shape), "machine": asdict(self.machine), "links": asdict(self.links),
            "predictions": [{
                "strategy": x.placement.name, "placement": asdict(x.placement), "fits": x.fits, "binding": x.binding,
                "gpu_bytes": x.memory.gpu_bytes, "host_bytes": x.memory.host_bytes, "pinned_bytes": x.memory.pinned_bytes,
                "nvme_bytes": x.memory.nvme_bytes, "memory": asdict(x.memory),
                "step_bound_s": x.step.seconds if x.step else None, "bound_by": x.step.bottleneck if x.step else None,
                "bytes_per_step": x.step.bytes_moved if x.step else None,
            } for x in predictions],
        }
