"""Training data addressed by global sample index, so every strategy and world size sees the same tokens.

Step s uses samples [s*G, (s+1)*G) with G the effective batch; rank r's micro-batch m takes the slice
(m * world + r) * micro_batch of it. Splitting G differently across ranks or accumulation never changes
which samples make up a step, and a restored run reads step k+1 without replaying the loader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from offloadlab.spec import DataSpec, RunSpec, SpecError


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


class TokenSource:
    def __init__(self, spec: DataSpec, vocab_size: int, seq_len: int, seed: int, tokenizer: Path | None = None):
        """tokenizer: the folder of the model's tokenizer, for text data (None: text is read as bytes)."""
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.tokens = _load_tokens(spec, tokenizer) if spec.kind != "synthetic" else None
        if self.tokens is not None:
            if len(self.tokens) < seq_len + 2:
                raise SpecError(
                    f"data.path {spec.path} holds {len(self.tokens)} tokens; seq_len + 2 = {seq_len + 2} needed"
                )
            if int(self.tokens.max()) >= vocab_size:
                raise SpecError(
                    f"data.path {spec.path} has token id {int(self.tokens.max())} >= vocab_size {vocab_size}"
                )

    def sample(self, index: int) -> torch.Tensor:
        """seq_len + 1 tokens for one global sample index."""
        if self.tokens is None:
            # A seeded random walk over the vocabulary: each token is the last plus 0..3, so the data has
            # structure a model can learn (the loss falls) while each sample is still new.
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
            start = torch.randint(0, self.vocab_size, (1,), generator=gen)
            steps = torch.randint(0, 4, (self.seq_len,), generator=gen)
            return torch.cat([start, start + steps.cumsum(0)]) % self.vocab_size
        windows = len(self.tokens) - self.seq_len - 1
        start = (index * self.seq_len) % windows
        return torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))

    def micro_batches(self, step: int, rank: int, world: int, micro_batch: int, grad_accum: int) -> list[Batch]:
        global_batch = micro_batch * grad_accum * world
        out = []
        for micro in range(grad_accum):
            first = step * global_batch + (micro * world + rank) * micro_batch
            rows = torch.stack([self.sample(first + i) for i in range(micro_batch)])
            out.append(Batch(inputs=rows[:, :-1].contiguous(), targets=rows[:, 1:].contiguous()))
        return out

    @classmethod
    def for_run(cls, spec: RunSpec) -> "TokenSource":
        """The run's data for its model: a Hugging Face model's text goes through the model's tokenizer."""
        from offloadlab.workload.model import vocab_size

        tokenizer = None
        if spec.model.is_hf:
            from offloadlab.workload.hf import hf_folder

            tokenizer = hf_folder(spec.model.hf_path)
        return cls(spec.data, vocab_size(spec.model, spec.seq_len), spec.seq_len, spec.seed, tokenizer)


def documents(path: Path, text_key: str) -> Iterator[str]:
    """A .jsonl file's documents (each line's `text_key`), or a text file as one document."""
    if path.suffix != ".jsonl":
        yield path.read_text()
        return
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)[text_key]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SpecError(
                    f"data.path {path} line {number}: not a JSON object with a {text_key!r} field "
                    "(set data.text_key to the field that holds the text)"
                ) from None


def load_tokenizer(folder: Path):
    """The model folder's own tokenizer, never fetched."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as err:
        raise SpecError(
            f"data.kind = \"text\" reads the model's tokenizer from {folder}, which holds none that "
            f"loads ({str(err).splitlines()[0]}): save it there (tokenizer.save_pretrained), or give "
            "token ids with data.kind = \"tokens\""
        ) from None


def tokenize(path: Path, text_key: str, folder: Path) -> np.ndarray:
    """Every document's token ids, each followed by the end-of-text token, in one array to pack from."""
    tokenizer = load_tokenizer(folder)
    end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    ids = [i for doc in documents(path, text_key) for i in tokenizer(doc, add_special_tokens=False)["input_ids"] + end]
    return np.asarray(ids, dtype=np.int64)


def _load_tokens(spec: DataSpec, tokenizer: Path | None) -> np.ndarray:
    if spec.kind == "text":
        if tokenizer is not None:
            return tokenize(spec.path, spec.text_key, tokenizer)
        return np.frombuffer(spec.path.read_bytes(), dtype=np.uint8)
    if spec.path.suffix == ".npy":
        return np.load(spec.path, mmap_mode="r")
    return np.memmap(spec.path, dtype=spec.token_dtype, mode="r")
