"""Issues 19 and 36 on a GPU: does the planner's GPU peak hold for Hugging Face models of real shapes
(Llama, Qwen2, Gemma-3, a Qwen3-MoE)?

    python bench/hf_gpu_peak.py write DIR NVME     # Llama-3.2-1B- and Qwen2.5-1.5B-shaped configs + specs
    offloadlab plan DIR/SPEC.toml --json > plan.json; offloadlab run DIR/SPEC.toml --out RUN
    python bench/hf_gpu_peak.py table PLAN.json RUN [PLAN.json RUN ...]

The configs are the public models' shapes (hidden size, layers, heads, kv heads, intermediate size,
vocabulary, tied embeddings) with random weights (model.hf_config): the planner counts their tensors on
the meta device and what their layers save for backward on the models' own code. Goal: GPU peak within 5%.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tomli_w
from rich.console import Console
from rich.table import Table

SHAPES = {
    "llama-3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    ),
    # Gemma-3-1B's public shape: 4 heads of 256 with one kv head, five sliding-window layers to one full,
    # a 262k vocabulary, tied embeddings.
    "gemma-3-1b": dict(
        model_type="gemma3_text",
        hidden_size=1152,
        intermediate_size=6912,
        num_hidden_layers=26,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        vocab_size=262144,
        sliding_window=512,
        max_position_embeddings=32768,
        query_pre_attn_scalar=256,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    # A Qwen3-MoE of about 1B parameters (the public ones start at 30B): 16 experts of 768, 4 routed a
    # token, in every layer.
    "qwen3-moe-1b": dict(
        model_type="qwen3_moe",
        hidden_size=1024,
        intermediate_size=3072,
        moe_intermediate_size=768,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        vocab_size=151936,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
}
STRATEGIES = [
    dict(name="fsdp2", engine="fsdp2"),
    dict(name="zero3-opt-cpu", engine="deepspeed", zero_stage=3, offload_optimizer="cpu"),
    dict(name="zero2-cpu", engine="deepspeed", zero_stage=2, offload_optimizer="cpu"),
]


def write(folder: Path, nvme: str) -> None:
    for name, shape in SHAPES.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "config.json").write_text(json.dumps(shape, indent=2))
        spec = dict(
            name=name,
            steps=4,
            seq_len=1024,
            micro_batch=4,
            precision="bf16",
            verify_checkpoint=False,
            nvme_path=nvme,
            model=dict(hf_config=name),
            strategy=STRATEGIES,
        )
        (folder / f"{name}.toml").write_text(tomli_w.dumps(spec))


def table(pairs: list[tuple[Path, Path]]) -> Table:
    from offloadlab.results.store import RunStore
    from offloadlab.results.summary import summarize

    out = Table(title="GPU peak: planned vs measured (allocated, GiB)", header_style="bold")
    for col in ("model", "strategy", "planned", "measured", "measured / planned", "step (s)"):
        out.add_column(col, justify="left" if col in ("model", "strategy") else "right")
    for plan_path, run_dir in pairs:
        planned = {p["strategy"]: p["gpu_bytes"] for p in json.loads(plan_path.read_text())["predictions"]}
        for s in summarize(RunStore(run_dir)):
            measured = s.peak_allocated_bytes
            ratio = f"{measured / planned[s.name]:.3f}" if measured and s.name in planned else s.status
            out.add_row(
                run_dir.name,
                s.name,
                f"{planned.get(s.name, 0) / 2**30:.2f}",
                "-" if measured is None else f"{measured / 2**30:.2f}",
                ratio,
                "-" if s.median_step_time_s is None else f"{s.median_step_time_s:.2f}",
            )
    return out


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(Path(sys.argv[2]), sys.argv[3])
    else:
        args = [Path(a) for a in sys.argv[2:]]
        Console(width=120).print(table(list(zip(args[::2], args[1::2]))))
