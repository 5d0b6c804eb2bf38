"""FSDP2's side of what offloadlab writes for users' own scripts: the FSDP sections of an Accelerate config.
No torch."""

from __future__ import annotations

from pathlib import Path

from offloadlab.spec import RunSpec


def file_names(name: str) -> list[str]:
    """None: Accelerate's FSDP plugin takes its settings inline."""
    return []


def export(spec: RunSpec, out_dir: Path, name: str) -> list[str]:
    """The lines of the Accelerate config."""
    strategy = spec.strategy[0]
    lines = [
        "distributed_type: FSDP",
        f"mixed_precision: {'bf16' if spec.precision == 'bf16' else 'no'}",
        "fsdp_config:",
        "  fsdp_version: 2",
        f"  fsdp_offload_params: {'true' if strategy.cpu_offload else 'false'}",
        f"  fsdp_reshard_after_forward: {'true' if strategy.reshard_after_forward else 'false'}",
        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
        "  fsdp_state_dict_type: SHARDED_STATE_DICT",
        f"  fsdp_activation_checkpointing: {'true' if spec.model.activation_checkpointing else 'false'}",
    ]
    return lines
