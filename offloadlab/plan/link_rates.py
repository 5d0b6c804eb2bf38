"""The link rates a plan's step predictions are computed from, measured on this machine (or read from a tune)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from offloadlab.engines.ops import announce_on, ensure_built
from offloadlab.measure import links as measure
from offloadlab.plan.accounting import Links, Machine
from offloadlab.spec import RunSpec
from offloadlab.workload.model import GPTConfig

BLOCK_MEASURED = "one block's forward and backward, measured now"
GIVEN_FLOPS = "given with --tflops"


def measure_links(
    spec: RunSpec,
    cfg: GPTConfig,
    machine: Machine,
    nvme_path: Path | None,
    tuned_dir: Path | None,
    console: Console,
    given_flops_per_s: float | None = None,
) -> Links:
    """The machine's links and compute rate; given_flops_per_s (`--tflops`) skips measuring a block."""
    ensure_built(("cpu_adam", "async_io") if nvme_path is not None else ("cpu_adam",), announce_on(console))
    with (
        measure.own_inductor_cache(),
        console.status(
            "measuring links: PCIe copies, Adam on CPU (DeepSpeed's op) and device, host passes, "
            "one block's forward and backward, NVMe"
        ),
    ):
        pcie = measure.measure_pinned_copy()
        nvme = measure.nvme_from_tune_store(tuned_dir) if tuned_dir else None
        if nvme is None and nvme_path is not None:
            nvme = measure.measure_nvme_quick(nvme_path)
        torch_cpu_adam = measure.measure_adam_params_per_s("torch")
        if pcie:
            device_adam = (
                measure.measure_adam_params_per_s("torch", "cuda"),
                measure.measure_adam_params_per_s("fused", "cuda"),
            )
        elif machine.gpu_mem_bytes is None:  # the CPU is the device
            device_adam = (torch_cpu_adam, measure.measure_adam_params_per_s("fused"))
        else:  # planning for a GPU this machine lacks: its CPU's Adam says nothing of that GPU's
            device_adam = (None, None)
        return Links(
            nvme_read=nvme[0] if nvme else None,
            nvme_write=nvme[1] if nvme else None,
            nvme_source=nvme[2] if nvme else "no --nvme given: NVMe placements get no predicted step",
            pcie_h2d=pcie.host_to_device_gbps * 1e9 if pcie else None,
            pcie_d2h=pcie.device_to_host_gbps * 1e9 if pcie else None,
            cpu_adam_params_per_s=measure.measure_adam_params_per_s("deepspeed-cpu"),
            torch_cpu_adam_params_per_s=torch_cpu_adam,
            device_adam_params_per_s=device_adam[0],
            device_fused_adam_params_per_s=device_adam[1],
            converting_upload_params_per_s=measure.measure_converting_upload_params_per_s() if pcie else None,
            host_passes_params_per_s=measure.measure_host_passes_params_per_s(),
            flops_per_s=given_flops_per_s
            or measure.measure_block_flops(cfg, spec.seq_len, spec.micro_batch, spec.precision),
            flops_source=GIVEN_FLOPS if given_flops_per_s else BLOCK_MEASURED,
        )
