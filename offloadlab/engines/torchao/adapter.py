"""torchao's CPUOffloadOptimizer on one GPU: the whole model on the GPU in fp32 (bf16 runs compute under
autocast; with bf16_master_weights the model itself is bf16), each parameter's AdamW on the CPU, with the
spec's gradient clipping added."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torchao.optim import CPUOffloadOptimizer

from offloadlab.engines.base import Engine
from offloadlab.engines.digests import digest_tree
from offloadlab.engines.dist import DistContext
from offloadlab.engines.ops import choose_deepspeed_accelerator, load_op
from offloadlab.engines.torchao.planner import kept_on_gpu
from offloadlab.spec import RunSpec, TorchAOStrategy
from offloadlab.workload.data import Batch
from offloadlab.workload.hf import initial_state, load_initial_state
from offloadlab.workload.model import build_model, lm_loss

STATE_FILE = "state.pt"
PROGRESS_FILE = "progress.json"


class ClippedCPUOffload(CPUOffloadOptimizer):
    """torchao's optimizer with gradient clipping, which it lacks: the global norm over every gradient, then
    each CPU gradient scaled once its copy has landed, just before its parameter's AdamW step. The norm is
    taken from the GPU gradients; where they are freed after the copy (offload_gradients), from the CPU
    copies. The GPU gradients are never scaled in place: their copies may still be reading them.
    With ratio < 1 the first parameters, all but `ratio` of the offloadable elements, join torchao's small
    ones on the GPU: their AdamW runs there while the CPU steps the rest."""

    def __init__(self, params, cpu_optimizer: str, max_norm: float, offload_gradients: bool, ratio: float, **adamw):
        params = [p for p in params if p.requires_grad]
        kept = kept_on_gpu([p.numel() for p in params], ratio)
        build = _adamw(cpu_optimizer)
        super().__init__(
            [p for i, p in enumerate(params) if i not in kept], build, offload_gradients=offload_gradients, **adamw
        )
        if kept:  # torchao puts its small parameters in d_param_groups and d_opt: these join them
            self.d_param_groups.append({"params": [params[i] for i in sorted(kept)]})
            self.d_opt = build(self.d_param_groups, **adamw)
        self.max_norm, self.offload_gradients = max_norm, offload_gradients

    def _clip_coefficient(self) -> float:
        """torch's clip_grad_norm_ coefficient: max_norm / (norm + 1e-6), at most 1."""
        on_gpu = [p.grad for group in self.d_param_groups for p in group["params"] if p.grad is not None]
        on_cpu = []
        if self.offload_gradients:
            for event in self.queue.values():
                event.synchronize()
            on_cpu = [self.param_d2h_map[p].grad for p in self.queue]
        else:
            on_gpu += [p.grad for p in self.queue]
        squares = sum(
            torch.nn.utils.get_total_norm(grads).double().square().item() for grads in (on_gpu, on_cpu) if grads
        )
        norm = torch.tensor(squares, dtype=torch.float64).sqrt().float()
        return torch.clamp(self.max_norm / (norm + 1e-6), max=1.0).item()

    @torch.no_grad()
    def step(self, closure=None):
        coefficient = self._clip_coefficient()
        if self.d_opt is not None:  # the small parameters, stepped on the GPU beside the CPU steps below
            if coefficient != 1.0:
                torch._foreach_mul_(
                    [p.grad for g in self.d_param_groups for p in g["params"] if p.grad is not None], coefficient
                )
            self.d_opt.step()
        for p_device, copied in self.queue.items():
            copied.synchronize()
            p_host = self.param_d2h_map[p_device]
            if coefficient != 1.0:
                p_host.grad.mul_(coefficient)
            self.optim_dict[p_device].step()
            with torch.cuda.stream(self.stream):  # upload it while the next parameter steps
                p_device.copy_(p_host, non_blocking=True)
        self.stream.synchronize()
        self.queue.clear()

    def refresh_host_copies(self) -> None:
        """After the GPU parameters were loaded: the CPU masters torchao keeps must hold the same values."""
        for p_device, p_host in self.param_d2h_map.items():
            p_host.copy_(p_device.detach())


def _adamw(cpu_optimizer: str):
    """AdamW for a group of parameters: on the CPU the strategy's (DeepSpeed's CPU Adam or torch's fused),
    on the GPU (torchao keeps parameters under 4,096 elements there) torch's fused. Adam's moments take the
    parameters' dtype: bf16 with bf16 master weights, as torch's AdamW makes them."""

    def build(groups, lr, betas, eps, weight_decay):
        first = groups[0]["params"]  # torchao passes one tensor a CPU group, a list for the GPU's
        tensor = first if isinstance(first, torch.Tensor) else first[0]
        on_cpu = tensor.device.type == "cpu"
        if on_cpu and cpu_optimizer == "deepspeed":
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            from deepspeed.utils import logger

            # One DeepSpeed optimizer a parameter: each would print its "Adam Optimizer #N is created" line.
            level = logger.level
            logger.setLevel(logging.WARNING)
            try:
                return DeepSpeedCPUAdam(
                    groups,
                    lr=lr,
                    betas=betas,
                    eps=eps,
                    weight_decay=weight_decay,
                    adamw_mode=True,
                    fp32_optimizer_states=tensor.dtype == torch.float32,
                )
            finally:
                logger.setLevel(level)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)

    return build


class TorchAOEngine(Engine):
    def __init__(self, ctx: DistContext, model: nn.Module, optimizer: ClippedCPUOffload, bf16: bool):
        super().__init__(ctx)
        self.model, self.optimizer, self.bf16 = model, optimizer, bf16

    @classmethod
    def build(
        cls, spec: RunSpec, strategy: TorchAOStrategy, ctx: DistContext, nvme_dir: Path | None
    ) -> "TorchAOEngine":
        return build_torchao(spec, strategy, ctx)

    @property
    def module(self) -> nn.Module:
        return self.model

    def train_step(self, batches: list[Batch]) -> float:
        losses = []
        for batch in batches:
            with self.phase("forward"), torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16):
                loss = lm_loss(self.model(batch.inputs.to(self.ctx.device)), batch.targets.to(self.ctx.device))
            with self.phase("backward"):  # each gradient starts down to the CPU as soon as it is final
                (loss / len(batches)).backward()
            losses.append(loss.item())
        with self.phase("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return sum(losses) / len(losses)

    def _state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.optimizer.state_dict()}

    def save(self, folder: Path, step: int) -> None:
        torch.save(self._state(), folder / STATE_FILE)
        (folder / PROGRESS_FILE).write_text(json.dumps({"step": step}))

    def load(self, folder: Path) -> int:
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.refresh_host_copies()
        self.optimizer.load_state_dict(state["optim"])
        return int(json.loads((folder / PROGRESS_FILE).read_text())["step"])

    def state_digest(self, scratch: Path, saved: Path | None) -> dict[str, str]:
        return digest_tree(self._state(), "full", {})


def build_torchao(spec: RunSpec, strategy: TorchAOStrategy, ctx: DistContext) -> TorchAOEngine:
    if ctx.device.type != "cuda":
        raise RuntimeError(strategy.needs_cuda)
    # One rank, but the checkpoint check's barriers and the other engines' teardown expect a process group.
    dist.init_process_group(backend=ctx.backend, device_id=ctx.device)
    if strategy.cpu_optimizer == "deepspeed":
        choose_deepspeed_accelerator()
        load_op("cpu_adam")  # through offloadlab's build lock; DeepSpeed then reuses what is loaded
    model = build_model(spec.model, spec.seq_len, spec.seed)
    state = initial_state(spec.model, spec.seed, built_empty=False)
    if state is not None:
        load_initial_state(model, state)
    model.to(ctx.device)
    if strategy.bf16_master_weights:
        model.to(torch.bfloat16)
    optimizer = ClippedCPUOffload(
        model.parameters(),
        strategy.cpu_optimizer,
        max_norm=spec.grad_clip,
        offload_gradients=strategy.offload_gradients,
        ratio=strategy.ratio,
        lr=spec.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=spec.weight_decay,
    )
    return TorchAOEngine(ctx, model, optimizer, bf16=spec.precision == "bf16")
