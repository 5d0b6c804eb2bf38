"""The planner's model of torchao's CPUOffloadOptimizer on one GPU."""

from __future__ import annotations

from offloadlab.plan.accounting import Links, Memory, Placement, Shape
from offloadlab.spec import TorchAOStrategy

# torchao keeps a parameter under this many elements on the GPU, with a GPU AdamW (its `minimal_size`).
MINIMAL_SIZE = 4096


def kept_on_gpu(numels: list[int], ratio: float) -> set[int]:
    """The indexes of the parameters stepped on the GPU for this ratio: the first of those torchao would
    offload, until they hold (1 - ratio) of the offloaded elements."""
    offloadable = [i for i, n in enumerate(numels) if n >= MINIMAL_SIZE]
    budget = (1 - ratio) * sum(numels[i] for i in offloadable)
    kept, held = set(), 0
    for i in offloadable:
        if held + numels[i] > budget:
            break
        kept.add(i)
        held += numels[i]
    return kept


def _offloaded(shape: Shape, ratio: float) -> list[int]:
    """The element counts of the parameters stepped on the CPU."""
    kept = kept_on_gpu(list(shape.param_numels), ratio)
    return [n for i, n in enumerate(shape.param_numels) if n >= MINIMAL_SIZE and i not in kept]


def state_bytes(strategy: TorchAOStrategy) -> int:
    """Bytes of each master, gradient and Adam moment: fp32, or bf16 with bf16 master weights."""
    return 2 if strategy.bf16_master_weights else 4


def pinned_buffers(p: Placement, shape: Shape, world: int, buffers: object | None) -> list[float]:
    """A pinned master and a pinned gradient for each offloaded parameter."""
    b = state_bytes(p.strategy)
    return [b * numel for numel in _offloaded(shape, p.strategy.ratio) for _ in range(2)]


def memory(p: Placement, shape: Shape, world: int, buffers: object | None, on_gpu: bool) -> Memory:
    """The whole model on the GPU in fp32 with its fp32 gradients (or, with offload_gradients, only those
    still being copied down); under bf16 autocast, each weight's bf16 copy made in forward is kept for
    backward. The host holds the fp32 masters and gradient copies (pinned) and Adam's m and v of the
    parameters it steps (ratio); the GPU the moments of the others. With bf16 master weights all of these
    are bf16 and autocast copies nothing."""
    m, n = Memory(), shape.n_params
    offloaded = sum(_offloaded(shape, p.strategy.ratio))
    b = state_bytes(p.strategy)
    dtype = "bf16" if b == 2 else "fp32"
    m.add("gpu", f"parameters ({dtype})", b * n)
    m.add("gpu", f"AdamW state of the parameters stepped on the GPU ({dtype})", 2 * b * (n - offloaded))
    grads = b * (shape.largest_param_numel if p.strategy.offload_gradients else n)
    m.add("gpu_turn", f"gradients ({dtype})", grads)
    m.add("gpu_step", f"gradients ({dtype})", grads)
    if shape.param_bytes == 2 and b == 4:
        m.add("gpu_turn", "autocast's bf16 weight copies", 2 * n)
    m.add("host_pinned", f"{dtype} masters + gradient copies", 2 * b * offloaded)
    m.add("host_pageable", "optimizer states", 2 * b * offloaded)
    m.host_build_bytes = 4 * n  # built in fp32 on the CPU, then moved to the GPU
    return m


def step_bytes(p: Placement, shape: Shape, world: int) -> dict[str, float]:
    """Each gradient goes down after every micro-batch's backward (the accumulated one again), each updated
    master comes back up once a step."""
    moved = state_bytes(p.strategy) * sum(_offloaded(shape, p.strategy.ratio))
    return {"nvme_read": 0.0, "nvme_write": 0.0, "pcie_h2d": moved, "pcie_d2h": moved * shape.grad_accum}


def param_upload_bytes(p: Placement, shape: Shape, world: int) -> float:
    """The updated masters, uploaded a parameter at a time while the next one steps."""
    return state_bytes(p.strategy) * sum(_offloaded(shape, p.strategy.ratio))


def param_nvme_read_bytes(p: Placement, shape: Shape, world: int) -> float:
    return 0.0


def optimizer_phase(
    p: Placement, shape: Shape, world: int, links: Links, swap_read: float, swap_write: float
) -> dict[str, float]:
    """AdamW on the CPU at the probed rate (DeepSpeed's CPU Adam, or torch's per-tensor AdamW standing in for
    its fused form, which the probes do not measure), and the norm's pass over the gradients; the upload
    overlaps the next parameter's step, so only the last one's shows. With ratio < 1 the GPU's AdamW on
    the kept parameters runs beside the CPU's steps, which take longer: it does not show."""
    offloaded = sum(_offloaded(shape, p.strategy.ratio))
    deepspeed = p.strategy.cpu_optimizer == "deepspeed"
    rate = links.cpu_adam_params_per_s if deepspeed else links.torch_cpu_adam_params_per_s
    out = {"cpu_adam": offloaded / rate}
    if p.strategy.offload_gradients:  # the norm is taken over the CPU copies
        out["host_passes"] = offloaded / links.host_passes_params_per_s
    if links.pcie_h2d:
        out["last_upload"] = state_bytes(p.strategy) * shape.largest_param_numel / links.pcie_h2d
    return out


def serial_in_training(p: Placement, shape: Shape, world: int, links: Links) -> dict[str, float]:
    """The gradients' copies run on their own stream beside backward: a PCIe part, not host work."""
    return {}


def overlapped_with_training(p: Placement) -> tuple[str, ...]:
    return ()


def checkpoint_bytes(strategy: TorchAOStrategy, n_params: int, param_bytes: int) -> int:
    """The weights and both Adam moments: 12 bytes a parameter in fp32, 6 with bf16 master weights."""
    return 3 * state_bytes(strategy) * n_params


def swap_bytes(strategy: TorchAOStrategy, n_params: int, param_bytes: int) -> int:
    return 0  # nothing on NVMe
