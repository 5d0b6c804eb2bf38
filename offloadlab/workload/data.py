"""Training data addressed by global sample index, so every strategy and world size sees the same tokens.

Step s uses samples [s*G, (s+1)*G) with G the effective batch; rank r's micro-batch m takes the slice
(m * world + r) * micro_batch of it. Splitting G differently across ranks or accumulation never changes
which samples make up a step, and a restored run reads step k+1 without replaying the loader.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from offloadlab.spec import DataSpec, SpecError


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


class TokenSource:
    def __init__(self, spec: DataSpec, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.tokens = _load_tokens(spec) if spec.kind != "synthetic" else None
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


def _load_tokens(spec: DataSpec) -> np.ndarray:
    if spec.kind == "text":
        return np.frombuffer(spec.path.read_bytes(), dtype=np.uint8)
    if spec.path.suffix == ".npy":
        return np.load(spec.path, mmap_mode="r")
    return np.memmap(spec.path, dtype=spec.token_dtype, mode="r")
