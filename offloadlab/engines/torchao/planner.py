"""The planner's model of torchao's CPUOffloadOptimizer on one GPU."""

from __future__ import annotations

from offloadlab.plan.accounting import Links, Memory, Placement, Shape
from offloadlab.spec import TorchAOStrategy

# torchao keeps a parameter under this many elements on the GPU, with a GPU AdamW (its `minimal_size`).
MINIMAL_SIZE = 4096


def _offloaded(shape: Shape) -> list[int]:
    return [numel for numel in shape.param_numels if numel >= MINIMAL_SIZE]


def pinned_buffers(p: Placement, shape: Shape, world: int, buffers: object | None) -> list[float]:
    """A pinned fp32 master and a pinned fp32 gradient for each offloaded parameter."""
    return [4 * numel for numel in _offloaded(shape) for _ in range(2)]


def memory(p: Placement, shape: Shape, world: int, buffers: object | None, on_gpu: bool) -> Memory:
    """The whole model on the GPU in fp32 with its fp32 gradients (or, with offload_gradients, only those
    still being copied down); under bf16 autocast, each weight's bf16 copy made in forward is kept for
    backward. The host holds the fp32 masters and gradient copies (pinned) and Adam's m and v."""
    m, n = Memory(), shape.n_params
    offloaded = sum(_offloaded(shape))
    m.add("gpu", "parameters (fp32)", 4 * n)
    m.add("gpu", "AdamW state of the small parameters (fp32)", 8 * (n - offloaded))
    grads = 4 * shape.largest_param_numel if p.strategy.offload_gradients else 4 * n
    m.add("gpu_turn", "gradients (fp32)", grads)
    m.add("gpu_step", "gradients (fp32)", grads)
    if shape.param_bytes == 2:
        m.add("gpu_turn", "autocast's bf16 weight copies", 2 * n)
    m.add("host_pinned", "fp32 masters + gradient copies", 8 * offloaded)
    m.add("host_pageable", "optimizer states", 8 * offloaded)
    m.host_build_bytes = 4 * n  # built in fp32 on the CPU, then moved to the GPU
    return m


def step_bytes(p: Placement, shape: Shape, world: int) -> dict[str, float]:
    """Each gradient goes down after every micro-batch's backward (the accumulated one again), each updated
    master comes back up once a step."""
    offloaded = sum(_offloaded(shape))
    return {
        "nvme_read": 0.0,
        "nvme_write": 0.0,
        "pcie_h2d": 4.0 * offloaded,
        "pcie_d2h": 4.0 * offloaded * shape.grad_accum,
    }


def param_upload_bytes(p: Placement, shape: Shape, world: int) -> float:
    """The updated masters, uploaded a parameter at a time while the next one steps."""
    return 4.0 * sum(_offloaded(shape))


def param_nvme_read_bytes(p: Placement, shape: Shape, world: int) -> float:
    return 0.0


def optimizer_phase(
    p: Placement, shape: Shape, world: int, links: Links, swap_read: float, swap_write: float
) -> dict[str, float]:
    """AdamW on the CPU at the probed rate (DeepSpeed's CPU Adam, or torch's per-tensor AdamW standing in for
    its fused form, which the probes do not measure), and the norm's pass over the gradients; the upload
    overlaps the next parameter's step, so only the last one's shows."""
    offloaded = sum(_offloaded(shape))
    deepspeed = p.strategy.cpu_optimizer == "deepspeed"
    rate = links.cpu_adam_params_per_s if deepspeed else links.torch_cpu_adam_params_per_s
    out = {"cpu_adam": offloaded / rate}
    if p.strategy.offload_gradients:  # the norm is taken over the CPU copies
        out["host_passes"] = offloaded / links.host_passes_params_per_s
    if links.pcie_h2d:
        out["last_upload"] = 4 * shape.largest_param_numel / links.pcie_h2d
    return out


def serial_in_training(p: Placement, shape: Shape, world: int, links: Links) -> dict[str, float]:
    """The gradients' copies run on their own stream beside backward: a PCIe part, not host work."""
    return {}


def overlapped_with_training(p: Placement) -> tuple[str, ...]:
    return ()


def checkpoint_bytes(strategy: TorchAOStrategy, n_params: int, param_bytes: int) -> int:
    """fp32 weights and both Adam moments: 12 bytes a parameter."""
    return 12 * n_params


def swap_bytes(strategy: TorchAOStrategy, n_params: int, param_bytes: int) -> int:
    return 0  # nothing on NVMe
