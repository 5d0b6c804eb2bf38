"""DeepSpeed's side of what offloadlab writes for users' own scripts: the DeepSpeed JSON of a strategy (the
one place its keys are spelled), its twin for an Accelerate script, and the tuned aio and swap buffer keys.
No torch: `plan --write` and `tune` write these without building anything."""

from __future__ import annotations

import json
from pathlib import Path

from offloadlab.engines.deepspeed.buffers import SwapBuffers
from offloadlab.spec import AioSettings, DeepSpeedStrategy, RunSpec


def deepspeed_config(spec: RunSpec, strategy: DeepSpeedStrategy, world_size: int, nvme_dir: Path | None) -> dict:
    """The DeepSpeed JSON config for a strategy: the one place its keys are spelled."""
    zero: dict = {
        "stage": strategy.zero_stage,
        "contiguous_gradients": True,
        "overlap_comm": True,
    }
    if strategy.offload_optimizer != "none":
        zero["offload_optimizer"] = {
            "device": strategy.offload_optimizer,
            "pin_memory": strategy.pin_memory,
            "ratio": strategy.ratio,
            **(
                {
                    "nvme_path": str(nvme_dir),
                    "buffer_count": strategy.optimizer_buffer_count,
                    "pipeline_read": strategy.pipeline_read,
                    "pipeline_write": strategy.pipeline_write,
                }
                if strategy.offload_optimizer == "nvme"
                else {}
            ),
            **(
                {"super_offload": True, "cpuadam_cores_perc": strategy.cpuadam_cores_perc}
                if strategy.super_offload
                else {}
            ),
        }
    if strategy.zenflow is not None:
        zero["zenflow"] = strategy.zenflow.model_dump()
    if strategy.offload_param != "none":
        zero["offload_param"] = {
            "device": strategy.offload_param,
            "pin_memory": strategy.pin_memory,
            **(
                {
                    "nvme_path": str(nvme_dir),
                    "buffer_count": strategy.buffer_count,
                    "buffer_size": strategy.buffer_size,
                    "max_in_cpu": strategy.max_in_cpu,
                }
                if strategy.offload_param == "nvme"
                else {}
            ),
        }
    if strategy.zero_stage == 3:
        zero.update(
            stage3_max_live_parameters=strategy.stage3_max_live_parameters,
            stage3_max_reuse_distance=strategy.stage3_max_reuse_distance,
            stage3_prefetch_bucket_size=strategy.stage3_prefetch_bucket_size,
            stage3_param_persistence_threshold=0,
            sub_group_size=strategy.sub_group_size,
        )
    return {
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
        "train_batch_size": spec.micro_batch * spec.grad_accum * world_size,
        "gradient_clipping": spec.grad_clip,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": spec.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": spec.weight_decay},
        },
        "bf16": {
            "enabled": spec.precision == "bf16",
            **(
                {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
                if strategy.bf16_master_weights
                else {}
            ),
        },
        "zero_optimization": zero,
        "aio": strategy.aio.model_dump(),
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def accelerate_deepspeed_config(config: dict) -> dict:
    """DeepSpeed's JSON for an Accelerate script: the script brings its optimizer and data loader, so the
    optimizer block goes (Accelerate refuses one in both places) and the batch sizes are Accelerate's."""
    out = {key: value for key, value in config.items() if key != "optimizer"}
    out.update(train_micro_batch_size_per_gpu="auto", train_batch_size="auto", gradient_accumulation_steps="auto")
    return out


def tuned_keys(aio: AioSettings, buffers: SwapBuffers | None) -> dict:
    """A tune's settings under DeepSpeed's own JSON keys, to merge into a hand-written config."""
    out: dict = {"aio": aio.model_dump()}
    if buffers is not None:
        out["zero_optimization"] = {
            "offload_param": {"buffer_size": buffers.param_buffer_size, "buffer_count": buffers.param_buffer_count},
            "stage3_max_live_parameters": buffers.stage3_max_live_parameters,
            "stage3_max_reuse_distance": buffers.stage3_max_reuse_distance,
        }
    return out


def file_names(name: str) -> list[str]:
    """What export writes for a placement called name: the JSON for deepspeed.initialize, and its
    Accelerate twin."""
    return [f"{name}_deepspeed.json", f"{name}_accelerate_deepspeed.json"]


def export(spec: RunSpec, out_dir: Path, name: str) -> list[str]:
    """The files of file_names for the spec's one strategy, written into out_dir; and the lines of the
    Accelerate config that point at them."""
    strategy = spec.strategy[0]
    config = deepspeed_config(spec, strategy, spec.nproc, spec.nvme_path if strategy.uses_nvme else None)
    plain_json, accelerate_json = (out_dir / n for n in file_names(name))
    plain_json.write_text(json.dumps(config, indent=2) + "\n")
    accelerate_json.write_text(json.dumps(accelerate_deepspeed_config(config), indent=2) + "\n")
    # Precision comes from the DeepSpeed file; Accelerate refuses it twice. On a machine without a GPU
    # the same file runs on DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu), as the tests do.
    lines = [
        "distributed_type: DEEPSPEED",
        "deepspeed_config:",
        f"  deepspeed_config_file: {accelerate_json.resolve()}",
        f"  zero3_init_flag: {'true' if strategy.zero_stage == 3 else 'false'}",
    ]
    return lines
