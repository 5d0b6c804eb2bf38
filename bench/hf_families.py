"""Issue 36 on the CPU: every family users bring, saved by transformers' own `save_pretrained` with
`pad_token_id` set, through every engine: the first loss against transformers' own on the same batch, and
the checkpoint check. tests/test_hf_families.py runs two strategies a family (every engine meets two
families); this runs all six for every family.

    python bench/hf_families.py DIR [FAMILY ...]     # saves DIR/FAMILY, runs DIR/run-FAMILY, prints the table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import tomli_w
import transformers
from rich.console import Console
from rich.table import Table

COMMON = dict(vocab_size=256, pad_token_id=2, bos_token_id=1, eos_token_id=0)
ROPE = dict(**COMMON, hidden_size=64, num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=128)
FAMILIES = {
    "phi3": lambda: transformers.Phi3Config(**ROPE, intermediate_size=128, num_key_value_heads=2),
    "gemma2": lambda: transformers.Gemma2Config(**ROPE, intermediate_size=128, num_key_value_heads=2, head_dim=16),
    "gemma3": lambda: transformers.Gemma3TextConfig(**ROPE, intermediate_size=128, num_key_value_heads=2, head_dim=16),
    "mixtral": lambda: transformers.MixtralConfig(
        **ROPE, intermediate_size=128, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
    ),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        **ROPE,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        head_dim=16,
    ),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**ROPE, intermediate_size=128),
    # Dropout off where the first loss is compared with transformers' (an eval-mode loss); GPT-2's own 0.1
    # is trained in tests/test_hf_families.py: test_a_model_with_dropout_resumes_exactly.
    "gpt2": lambda: transformers.GPT2Config(
        **COMMON, n_embd=64, n_head=4, n_layer=2, n_positions=128, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    ),
    "falcon": lambda: transformers.FalconConfig(**COMMON, hidden_size=64, num_attention_heads=4, num_hidden_layers=2),
}
STRATEGIES = [
    dict(name="zero1", engine="deepspeed", zero_stage=1),
    dict(name="zero2-cpu", engine="deepspeed", zero_stage=2, offload_optimizer="cpu"),
    dict(name="zero3-cpu", engine="deepspeed", zero_stage=3, offload_optimizer="cpu", offload_param="cpu"),
    dict(
        name="zero3-nvme",
        engine="deepspeed",
        zero_stage=3,
        offload_optimizer="nvme",
        offload_param="nvme",
        buffer_count=5,
        buffer_size=1_000_000,
    ),
    dict(name="fsdp2", engine="fsdp2"),
    dict(name="fsdp2-cpu-offload", engine="fsdp2", cpu_offload=True),
]
BATCH = dict(steps=3, seq_len=32, micro_batch=2, grad_accum=1, precision="fp32")


def save_family(folder: Path, family: str) -> Path:
    import torch

    torch.manual_seed(1)
    transformers.AutoModelForCausalLM.from_config(FAMILIES[family]()).save_pretrained(folder)
    return folder


def reference_first_loss(folder: Path) -> float:
    """The first step's loss computed by transformers itself from the files, on the run's first batch."""
    import torch

    from offloadlab.spec import DataSpec
    from offloadlab.workload.data import TokenSource
    from offloadlab.workload.model import lm_loss

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    (batch,) = TokenSource(DataSpec(), 256, BATCH["seq_len"], seed=0).micro_batches(0, 0, 1, BATCH["micro_batch"], 1)
    with torch.no_grad():
        return lm_loss(model(input_ids=batch.inputs, use_cache=False).logits, batch.targets).item()


def run_family(root: Path, family: str, nvme: Path) -> Path:
    folder = save_family(root / family, family)
    spec = root / f"{family}.toml"
    raw = dict(name=family, **BATCH, nvme_path=str(nvme), model=dict(hf_model=str(folder)), strategy=STRATEGIES)
    spec.write_text(tomli_w.dumps(raw))
    run_dir = root / f"run-{family}"
    offloadlab = Path(sys.executable).parent / "offloadlab"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    subprocess.run([str(offloadlab), "run", str(spec), "--out", str(run_dir)], env=env, check=False)
    return run_dir


def table(root: Path, families: list[str]) -> Table:
    from offloadlab.results.store import RunStore

    out = Table(title="every family through every engine (first loss / transformers' own, checkpoint)")
    out.add_column("family")
    for s in STRATEGIES:
        out.add_column(s["name"], justify="right")
    for family in families:
        reference = reference_first_loss(root / family)
        store = RunStore(root / f"run-{family}")
        cells = []
        for row in store.strategies(store.run()["id"]):
            steps = store.steps(row["id"])
            if row["status"] != "done" or not steps:
                cells.append(f"[red]{row['status']}[/]")
                continue
            ratio = steps[0].loss / reference
            verified = {1: "ok", 0: "[red]FAILED[/]", None: "-"}[row["checkpoint_verified"]]
            cells.append(f"{ratio:.6f} {verified}")
        out.add_row(family, *cells)
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve()
    families = sys.argv[2:] or sorted(FAMILIES)
    nvme = root / "nvme"
    nvme.mkdir(parents=True, exist_ok=True)
    for family in families:
        if not (root / f"run-{family}").exists():
            run_family(root, family, nvme)
    Console(width=150).print(table(root, families))
    print(json.dumps({"families": families}))
