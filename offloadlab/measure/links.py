"""Measured speeds of what a training step crosses: PCIe, CPU Adam and the host-memory passes around it,
one transformer block's forward and backward, and the NVMe drive (from `tune`'s stored results, else one
quick measurement).

The planner bounds step times with these; `tune` reports the PCIe copy beside the drive's figures,
since a swap-in from NVMe ends on the GPU.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from offloadlab.results.figures import flops_per_token
from offloadlab.results.status import Status
from offloadlab.workload.model import Block, GPTConfig


@contextlib.contextmanager
def own_inductor_cache() -> Iterator[None]:
    """torch makes its compile cache folder (TMPDIR/torchinductor_USER) when the first optimizer is built, as
    that imports dynamo, and leaves it empty: nothing here compiles. A folder of this process's own stands
    in for it and is removed after (torch's function that names its folder imports dynamo, so the folder
    cannot be found first and removed after). A cache folder the user set stays theirs."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="offloadlab-torch-cache-") as folder:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
        try:
            yield
        finally:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]


def best_seconds(run, repeats: int, cuda: bool) -> float:
    """The fastest of `repeats` timed calls of `run`, after one untimed call (first touch, mapping, state
    allocation and kernel choice are not the steady rate); with cuda, each call waits for the GPU."""

    def call() -> None:
        run()
        if cuda:
            torch.cuda.synchronize()

    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


@dataclass(frozen=True)
class PcieSpeed:
    host_to_device_gbps: float
    device_to_host_gbps: float


def measure_pinned_copy(nbytes: int = 256 << 20, repeats: int = 5) -> PcieSpeed | None:
    """Best of `repeats` pinned host<->GPU copies of `nbytes`; None without a GPU."""
    if not torch.cuda.is_available():
        return None
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    h2d = best_seconds(lambda: device.copy_(host, non_blocking=True), repeats, cuda=True)
    d2h = best_seconds(lambda: host.copy_(device, non_blocking=True), repeats, cuda=True)
    return PcieSpeed(host_to_device_gbps=nbytes / h2d / 1e9, device_to_host_gbps=nbytes / d2h / 1e9)


def last_level_cache_bytes() -> int:
    """The largest CPU cache cpu0 reports (sysfs), or 64 MiB where none is listed."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=64 << 20)


@dataclass(frozen=True)
class HostProbe:
    """The size of a host-rate probe. A server CPU's L3 (300-480 MiB on the machines here) can hold a small
    probe whole, and a step over billions of parameters runs at DRAM speed, not the cache's: a probe
    covers 4x the last-level cache, and at least `min_numel` elements."""

    bytes_per_element: int
    min_numel: int

    def numel(self) -> int:
        return max(self.min_numel, 4 * last_level_cache_bytes() // self.bytes_per_element)


ADAM_PROBE = HostProbe(bytes_per_element=16, min_numel=8 << 20)  # fp32 parameter, gradient, m and v
HOST_PASSES_PROBE = HostProbe(bytes_per_element=4 + 4 + 2, min_numel=32 << 20)  # fp32 gradient and master, 16-bit copy


UPLOAD_PROBE = HostProbe(bytes_per_element=4 + 2, min_numel=64 << 20)  # fp32 master, 16-bit copy


ADAM_KINDS = ("deepspeed-cpu", "torch", "fused")


def measure_adam_params_per_s(kind: str, device: str = "cpu", numel: int | None = None, repeats: int = 3) -> float:
    """Parameters per second one optimizer step updates: DeepSpeed's CPUAdam, torch's AdamW as FSDP2 builds
    it (torch picks foreach on a GPU, the per-tensor loop on the CPU), or its fused form (the stand-in for
    DeepSpeed's FusedAdam on a GPU)."""
    if kind not in ADAM_KINDS:
        raise ValueError(f"unknown Adam kind {kind!r}: one of {', '.join(ADAM_KINDS)}")
    if numel is None:
        numel = ADAM_PROBE.numel() if device == "cpu" else 256 << 20
    param = torch.zeros(numel, dtype=torch.float32, device=device, requires_grad=True)
    param.grad = torch.full_like(param, 1e-3)
    if kind == "deepspeed-cpu":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        from offloadlab.engines.ops import load_op

        load_op("cpu_adam")
        optimizer = DeepSpeedCPUAdam([param], lr=1e-4)
    else:
        optimizer = torch.optim.AdamW([param], lr=1e-4, fused=True if kind == "fused" else None)
    return numel / best_seconds(optimizer.step, repeats, cuda=device != "cpu")


def measure_host_passes_params_per_s(numel: int | None = None, repeats: int = 3) -> float:
    """Parameters per second through the two host-memory passes DeepSpeed's CPU-offloaded step makes
    beside CPU Adam: gradient clipping scales the fp32 gradient partition in place, and the updated fp32
    master is copied into the 16-bit parameter buffer (stage_1_and_2.step, stage3.step). FSDP2 with CPU
    offload makes passes of the same cost (clip_grad_norm_'s norm and scale)."""
    numel = numel or HOST_PASSES_PROBE.numel()
    grad, master = torch.ones(numel), torch.ones(numel)
    half = torch.empty(numel, dtype=torch.bfloat16)

    def passes() -> None:
        grad.mul_(0.5)
        half.copy_(master)

    return numel / best_seconds(passes, repeats, cuda=False)


def measure_converting_upload_params_per_s(numel: int | None = None, repeats: int = 3) -> float | None:
    """Parameters per second of what DeepSpeed's ZeRO-3 upload adds to a host pass, with the parameters on
    the GPU and the optimizer offloaded: stage3 copies each updated fp32 sub-group (pageable host memory)
    into the GPU's 16-bit partition with one `copy_`, and torch converts such a copy on the CPU into a
    pageable temporary, then uploads from pageable memory. The host passes already count one fp32 -> 16-bit
    pass, so this is the copy's time less a host-side 16-bit copy. None without a GPU."""
    if not torch.cuda.is_available():
        return None
    numel = numel or UPLOAD_PROBE.numel()
    master = torch.ones(numel)
    on_host = torch.empty(numel, dtype=torch.bfloat16)
    on_device = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    upload = best_seconds(lambda: on_device.copy_(master), repeats, cuda=True)
    host_pass = best_seconds(lambda: on_host.copy_(master), repeats, cuda=False)
    return numel / max(upload - host_pass, 1e-9)


# A CPU takes seconds for one full-size block; the rate per FLOP holds at this size.
CPU_BLOCK_MAX_D, CPU_BLOCK_MAX_TOKENS = 1024, 512


def measure_block_flops(cfg: GPTConfig, seq_len: int, micro_batch: int, precision: str, repeats: int = 3) -> float:
    """Model FLOP/s of one transformer block's forward and backward at the run's shape, on the training device.

    A dense matmul overstates what a step reaches (norms, attention, GELU and small kernels run far below
    it), so compute bounds come from the model's own block.
    """
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if precision == "bf16" and cuda else torch.float32
    if not cuda:
        # Fewer heads of the same size: a width that is not a multiple of the head size cannot be split.
        head_dim = cfg.d_model // cfg.n_heads
        n_heads = max(1, min(cfg.n_heads, CPU_BLOCK_MAX_D // head_dim))
        cfg = replace(cfg, d_model=n_heads * head_dim, n_heads=n_heads)
        seq_len = min(seq_len, CPU_BLOCK_MAX_TOKENS)
        micro_batch = max(1, min(micro_batch, CPU_BLOCK_MAX_TOKENS // seq_len))
    device = "cuda" if cuda else "cpu"
    block = Block(cfg).to(device=device, dtype=dtype)
    x = torch.randn(micro_batch, seq_len, cfg.d_model, device=device, dtype=dtype, requires_grad=True)

    seconds = best_seconds(lambda: block(x).sum().backward(), repeats, cuda)
    block_params = sum(p.numel() for p in block.parameters())
    return flops_per_token(block_params, 1, cfg.d_model, seq_len) * micro_batch * seq_len / seconds


def nvme_from_tune_store(tune_dir: Path) -> tuple[float, float, str] | None:
    """(read B/s, write B/s, source) of a finished `offloadlab tune` run's best point."""
    from offloadlab.results.store import DB_NAME, RunStore

    if not (tune_dir / DB_NAME).is_file():
        return None
    store = RunStore(tune_dir)
    try:
        run = store.run()
        best = [p for p in store.tune_points(run["id"]) if p.is_best]
        if run["status"] != Status.DONE or not best:
            return None
        return best[0].read_gbps * 1e9, best[0].write_gbps * 1e9, f"tune results in {tune_dir}"
    finally:
        store.close()


def measure_nvme_quick(nvme_path: Path, io_size: int = 64 << 20) -> tuple[float, float, str]:
    """One measurement at DeepSpeed's default aio settings, in a folder of our own that is removed after."""
    import shutil
    import uuid

    from offloadlab.checks.host import check_direct_io, check_directory, check_free_disk
    from offloadlab.engines.ops import load_op
    from offloadlab.measure.aio_bench import DEEPSPEED_DEFAULT, AioBench

    needed = io_size + (256 << 20)
    check_directory(nvme_path, "--nvme")
    check_direct_io(nvme_path, "--nvme", needed)
    check_free_disk(nvme_path, needed, "--nvme")
    load_op("async_io")
    work = nvme_path / f"offloadlab-plan-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        bench = AioBench(work, io_size)
        try:
            t = bench.measure(DEEPSPEED_DEFAULT)
        finally:
            bench.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return (
        t.read_gbps * 1e9,
        t.write_gbps * 1e9,
        f"a quick measurement of {nvme_path} at DeepSpeed's default aio settings",
    )
