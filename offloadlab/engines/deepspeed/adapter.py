"""DeepSpeed ZeRO 1/2/3 with optimizer and parameter offload to none/cpu/nvme (ZeRO-Infinity)."""

from __future__ import annotations

import ctypes
import glob
import hashlib
import logging
import mmap
import os
import re
from pathlib import Path

import numpy as np
import torch

from offloadlab.engines.base import Engine
from offloadlab.engines.deepspeed.config import deepspeed_config
from offloadlab.engines.digests import digest_tree, tensor_digest
from offloadlab.engines.dist import DistContext, global_mean
from offloadlab.engines.ops import choose_deepspeed_accelerator, load_op
from offloadlab.results.status import Status
from offloadlab.spec import DeepSpeedStrategy, RunSpec
from offloadlab.workload.data import Batch
from offloadlab.workload.hf import copy_whole, initial_state, load_initial_state
from offloadlab.workload.model import lm_loss, model_factory

CHECKPOINT_TAG = "state"


class DeepSpeedEngine(Engine):
    def __init__(self, ctx: DistContext, engine):
        super().__init__(ctx)
        self.engine = engine

    @classmethod
    def build(
        cls, spec: RunSpec, strategy: DeepSpeedStrategy, ctx: DistContext, nvme_dir: Path | None
    ) -> "DeepSpeedEngine":
        return build_deepspeed(spec, strategy, ctx, nvme_dir)

    @classmethod
    def failure_reason(cls, exc: BaseException) -> tuple[Status, str] | None:
        if "Not enough buffers" in str(exc):  # the parameter swapper ran out of its buffer_count
            first_line = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]
            return Status.DOES_NOT_FIT, (
                f"NVMe swap buffers too few ({first_line}); raise buffer_count or lower stage3_max_reuse_distance"
            )
        return None

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def train_step(self, batches: list[Batch]) -> float:
        losses = []
        for batch in batches:
            with self.phase("forward"):
                loss = lm_loss(self.engine(batch.inputs.to(self.ctx.device)), batch.targets.to(self.ctx.device))
            with self.phase("backward"):
                self.engine.backward(loss)
            with self.phase("optimizer"):
                self.engine.step()
            losses.append(loss.item())
        return global_mean(sum(losses) / len(losses), self.ctx)

    def save(self, folder: Path, step: int) -> None:
        self.engine.save_checkpoint(str(folder), tag=CHECKPOINT_TAG, client_state={"step": step}, save_latest=False)

    def load(self, folder: Path) -> int:
        path, client_state = self.engine.load_checkpoint(_glob_safe(folder), tag=CHECKPOINT_TAG)
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint under {folder}")
        if self.engine.zero_nvme_offload_optimizer():
            self._restore_unswapped_subgroups(folder)
        return int(client_state["step"])

    def _restore_unswapped_subgroups(self, folder: Path) -> None:
        """Work around DeepSpeed 0.19.8 losing part of the state on restore with offload_optimizer = nvme.

        Its load copies back only the NVMe swap files. A ZeRO-3 sub-group smaller than max(1 MiB, aio
        block_size) is never swapped: its fp32 master and Adam moments live in RAM, are saved in the
        optim_states file, and are not read back, so training resumes from the initial weights for that
        sub-group (a tiny model, or the small last sub-group of a large one). Restore them from that file.
        """
        opt = self.engine.optimizer
        in_ram = [i for i in self._subgroups() if not opt._swappable_optimizer_subgroup(i)]
        if not in_ram:
            return
        saved = load_checkpoint_file(Path(self.engine._get_zero_ckpt_name(str(folder), CHECKPOINT_TAG)))
        saved = saved["optimizer_state_dict"]
        for i in in_ram:
            fp32 = opt.fp32_partitioned_groups_flat[i]
            fp32.data.copy_(saved["fp32_flat_groups"][i])
            opt.optimizer.state[fp32] = {
                k: v.clone().to(fp32.device) if torch.is_tensor(v) else v
                for k, v in saved["optimizer_state_dict"]["state"][i].items()
            }
            opt._reassign_or_swap_out_partitioned_parameters(i)

    def state_digest(self, scratch: Path, saved: Path | None) -> dict[str, str]:
        # DeepSpeed's own checkpoint is the complete state (partitions, fp32 masters, NVMe swap files);
        # a live state was saved once into scratch so both sides are read the same way.
        if saved is None:
            self.save(scratch, step=-1)
            saved = scratch
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        if self.ctx.rank != 0:
            return {}
        digest = digest_checkpoint_files(saved / CHECKPOINT_TAG)
        # A swapped sub-group's Adam state in the optim_states file is whatever its RAM buffer held when
        # saved; the authoritative copy is its swap file under offloaded_tensors/, which is digested.
        swapped = {i for i in self._subgroups() if self.engine.optimizer._swappable_optimizer_subgroup(i)}
        stale = re.compile(r"optim_states\.pt/optimizer_state_dict/optimizer_state_dict/state/(\d+)/")
        return {k: v for k, v in digest.items() if not ((m := stale.search(k)) and int(m.group(1)) in swapped)}

    def pinned_swap_bytes(self) -> int:
        """The page-locked RAM DeepSpeed's NVMe swappers hold: one buffer_size buffer per buffer_count for
        the parameters, optimizer_buffer_count sub-group-sized fp32 buffers for the optimizer state."""
        total = 0
        swapper = getattr(next(self.engine.module.parameters()), "nvme_swapper", None)
        if swapper is not None:
            total += swapper.buffers.numel() * swapper.buffers.element_size()
        optimizer_swapper = getattr(self.engine.optimizer, "optimizer_swapper", None)
        if optimizer_swapper is not None:
            total += sum(b.numel() * b.element_size() for b in optimizer_swapper.swap_buffer_manager.all_buffers)
        return total

    def tensors_on_nvme(self) -> tuple[int, int] | None:
        """(parameters, optimizer sub-groups) DeepSpeed keeps on NVMe on this rank; None if it offloads
        nothing there. It swaps a tensor only from max(1 MiB, the aio block size) (swappable_tensor,
        is_swappable_tensor), and moves the parameters its max_in_cpu buffer holds back to RAM for good
        (stage3._move_to_flat_buffer marks them 'not-nvme'): a small model asked for NVMe may stay in RAM."""
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

        offloads = (self.engine.zero_offload_param(), self.engine.zero_offload_optimizer())
        if OffloadDeviceEnum.nvme not in [offload.device for offload in offloads if offload is not None]:
            return None
        params = sum(
            getattr(getattr(p, "ds_tensor", None), "final_location", None) == OffloadDeviceEnum.nvme
            for p in self.engine.module.parameters()
        )
        optimizer = self.engine.optimizer
        groups = sum(optimizer._swappable_optimizer_subgroup(i) for i in self._subgroups())
        return params, groups

    def _subgroups(self) -> range:
        if not self.engine.zero_nvme_offload_optimizer():
            return range(0)
        return range(len(self.engine.optimizer.fp32_partitioned_groups_flat))


def _glob_safe(folder: Path) -> str:
    """The folder as DeepSpeed's load_checkpoint may take it: it globs the path, so a folder named "[x]"
    matched nothing. The rank's working directory is the run folder, which holds the checkpoints: relative
    to it the path holds only safe names."""
    relative = os.path.relpath(folder)
    return relative if glob.escape(relative) == relative and not relative.startswith("..") else str(folder)


def _trusted_classes() -> list:
    """The non-tensor types DeepSpeed 0.19.8 pickles into its checkpoint files (found with torch's
    get_unsafe_globals_in_checkpoint on ZeRO-1/2/3 CPU and NVMe checkpoints)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load_checkpoint_file(path: Path, mmap: bool = False):
    """A checkpoint file read without running arbitrary pickled code: only tensors, containers and the
    allow-listed DeepSpeed types load, so a .pt planted in the folder cannot execute anything."""
    with torch.serialization.safe_globals(_trusted_classes()):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def digest_checkpoint_files(folder: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = str(path.relative_to(folder))
        if path.suffix == ".pt":
            # Mapped, not read: the optimizer file holds 12 bytes a parameter (17 GiB at 1.42B).
            state = load_checkpoint_file(path, mmap=True)
            # The client state's step is -1 for a digest save; progress is compared separately.
            if isinstance(state, dict):
                state.pop("step", None)
            digest_tree(state, rel, out, _digest_dropping_pages)
        else:
            with path.open("rb") as f:  # NVMe swap files run to GBs: hashed in chunks
                out[rel] = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    return out


_LIBC = ctypes.CDLL(None, use_errno=True)
_MADV_DONTNEED = 4


def _digest_dropping_pages(tensor: torch.Tensor) -> str:
    """Hash a tensor mapped from a checkpoint file, dropping each chunk's pages from this process once hashed.

    Mapped pages count in the resident set (and so in the run's host RSS peak) until dropped; torch.load
    maps the file privately and nothing writes it, so a page touched again is read back from the file."""
    return tensor_digest(tensor, after_chunk=_drop_pages)


def _drop_pages(chunk: np.ndarray) -> None:
    start, end = chunk.ctypes.data, chunk.ctypes.data + chunk.nbytes
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the chunk only
    last = end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        _LIBC.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED)


def _write_gathered(param: torch.Tensor, value: torch.Tensor) -> None:
    """Whole on every rank inside; rank 0's copy is what is partitioned again."""
    import deepspeed

    with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
        param.copy_(value)


def build_deepspeed(
    spec: RunSpec, strategy: DeepSpeedStrategy, ctx: DistContext, nvme_dir: Path | None
) -> DeepSpeedEngine:
    choose_deepspeed_accelerator()
    for op in strategy.ops_needed:  # through offloadlab's build lock; DeepSpeed then reuses what is loaded
        load_op(op)
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="nccl" if ctx.device.type == "cuda" else "gloo", verbose=False)
    config = deepspeed_config(spec, strategy, ctx.world_size, nvme_dir)
    partitioned = strategy.zero_stage == 3
    # Model code imported before zero.Init; under it every weight is copied in after the build.
    build = model_factory(spec.model, spec.seq_len, spec.seed, values_copied_in=partitioned)
    if partitioned:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = build()
    else:
        model = build()
    state = initial_state(spec.model, spec.seed, built_empty=partitioned)
    if state is not None:
        load_initial_state(model, state, _write_gathered if partitioned else copy_whole)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    if strategy.zenflow is not None and strategy.zero_stage < 3:
        point_zenflow_weights_at_their_columns(engine.optimizer)
    return DeepSpeedEngine(ctx, engine)


def point_zenflow_weights_at_their_columns(optimizer) -> None:
    """Work around DeepSpeed 0.19.8's ZenFlow at ZeRO-1/2 training with scrambled weights.

    ZenFlow flattens each 2-D parameter transposed, columns contiguous (zenflow_utils._flatten_dense_tensors),
    but the ZeRO-1/2 optimizer points the module at its slice of that buffer viewed untransposed
    (_update_model_bit16_weights), after initialize and after every step: the model computes with the
    weights scrambled (a tiny GPT's first loss 5.574 against 5.579 from the same weights elsewhere), and
    each gradient is flattened back transposed onto other elements. Pointing each 2-D parameter at its
    slice transposed back restores the model's own weights, and gradients land where ZenFlow keeps them."""

    def update_model_weights(group_index: int) -> None:
        flat = optimizer.bit16_groups_flat[group_index]
        for p, meta, offset in zip(
            optimizer.round_robin_bit16_groups[group_index],
            optimizer.round_robin_bit16_meta[group_index],
            optimizer.round_robin_bit16_offsets[group_index],
        ):
            piece = flat.narrow(0, offset, meta.numel())
            p.data = piece.view(meta.shape[1], meta.shape[0]).t() if meta.dim() == 2 else piece.view(meta.shape)
        for param_index, param in enumerate(optimizer.bit16_groups[group_index]):
            new_index = optimizer.round_robin_bit16_indices[group_index][param_index]
            param.data = optimizer.round_robin_bit16_groups[group_index][new_index].data

    optimizer._update_model_bit16_weights = update_model_weights
    for group_index in range(len(optimizer.bit16_groups)):
        update_model_weights(group_index)
