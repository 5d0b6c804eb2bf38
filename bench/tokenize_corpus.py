"""How long `offloadlab run` takes to read, tokenize and check a large text corpus before any process
starts, and whether its progress keeps moving (issue 36: "tokenizing a 1 GB corpus shows progress").

    python bench/tokenize_corpus.py --mb 1024 [--kind txt|jsonl|both] [--workdir DIR]

It writes a corpus of seeded Zipf-distributed words (documents of 50-400 words) and a byte-level BPE
tokenizer trained on its first megabyte (8,000 tokens, as a small real vocabulary), then runs the run's
own data step (`offloadlab.workload.data.run_tokens`) and prints, per corpus: MB/s, tokens, the longest
gap between two progress updates (what a user watches), and the process's peak RSS. Everything it writes
is under a temporary folder it removes.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from offloadlab.spec import parse_spec
from offloadlab.workload.data import run_tokens

VOCAB_WORDS = 20_000
SEED = 0


def write_corpus(path: Path, megabytes: int, jsonl: bool) -> None:
    rng = np.random.default_rng(SEED)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(VOCAB_WORDS)]
    target = megabytes << 20
    written = 0
    vocabulary = np.array(words)
    with path.open("w", encoding="utf-8") as f:
        while written < target:
            lengths = rng.integers(50, 400, size=64)
            ids = np.minimum(rng.zipf(1.2, size=int(lengths.sum())), VOCAB_WORDS) - 1
            for document in np.split(vocabulary[ids], np.cumsum(lengths)[:-1]):
                text = " ".join(document)
                line = json.dumps({"text": text}) + "\n" if jsonl else text + "\n"
                f.write(line)
                written += len(line)


def save_tokenizer(folder: Path, sample: Path) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    text = sample.read_text(encoding="utf-8")[: 1 << 20]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([text], vocab_size=8000, special_tokens=["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(folder)


def spec_for(corpus: Path, model: Path):
    raw = {
        "name": "bench",
        "steps": 2,
        "seq_len": 1024,
        "model": {"hf_model": str(model)},
        "data": {"kind": "text", "path": str(corpus)},
        "strategy": [{"name": "fsdp2", "engine": "fsdp2"}],
    }
    return parse_spec(raw, "bench")


def save_model(folder: Path) -> None:
    """A tiny Llama whose vocabulary holds the tokenizer's ids (the data check holds ids to it)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=8000, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def measure(corpus: Path, model: Path) -> dict:
    spec = spec_for(corpus, model)
    updates: list[float] = []
    began = time.monotonic()
    tokens = run_tokens(spec, lambda done, total: updates.append(time.monotonic()))
    wall = time.monotonic() - began
    marks = [began, *updates]
    return {
        "MB": corpus.stat().st_size / 2**20,
        "wall_s": wall,
        "tokens": len(tokens),
        "longest_gap_s": max(b - a for a, b in zip(marks, marks[1:])),
        "first_update_s": updates[0] - began if updates else None,
        "updates": len(updates),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--kind", choices=("txt", "jsonl", "both"), default="both")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    console = Console()
    work = Path(tempfile.mkdtemp(prefix="tokenize-bench-", dir=args.workdir))
    try:
        model = work / "model"
        save_model(model)
        table = Table("kind", "MiB", "wall s", "MiB/s", "M tokens", "first update s", "longest gap s", "updates")
        kinds = ("txt", "jsonl") if args.kind == "both" else (args.kind,)
        for kind in kinds:
            corpus = work / f"corpus.{kind}"
            with console.status(f"writing a {args.mb} MiB .{kind} corpus"):
                write_corpus(corpus, args.mb, jsonl=kind == "jsonl")
            if not (model / "tokenizer.json").exists():
                save_tokenizer(model, corpus)
            with console.status(f"tokenizing {corpus.name}"):
                m = measure(corpus, model)
            table.add_row(
                kind,
                f"{m['MB']:.0f}",
                f"{m['wall_s']:.1f}",
                f"{m['MB'] / m['wall_s']:.1f}",
                f"{m['tokens'] / 1e6:.1f}",
                f"{m['first_update_s']:.2f}",
                f"{m['longest_gap_s']:.2f}",
                str(m["updates"]),
            )
            corpus.unlink()
        console.print(table)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        console.print(f"peak RSS of this process: {peak:.2f} GiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
