"""Training data addressed by global sample index, so every strategy and world size sees the same tokens.

Step s uses samples [s*G, (s+1)*G) with G the effective batch; rank r's micro-batch m takes the slice
(m * world + r) * micro_batch of it. Splitting G differently across ranks or accumulation never changes
which samples make up a step, and a restored run reads step k+1 without replaying the loader.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from offloadlab.spec import DataSpec, RunSpec, SpecError


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


OnProgress = Callable[[int, int], None]
"""(bytes read, bytes in all) of the corpus being tokenized."""


class TokenSource:
    def __init__(
        self,
        spec: DataSpec,
        vocab_size: int,
        seq_len: int,
        seed: int,
        tokenizer: Path | None = None,
        tokens: np.ndarray | None = None,
    ):
        """tokenizer: the folder of the model's tokenizer, for text data (None: text is read as bytes);
        tokens: the data already read and checked (the run folder's cache), else it is read here."""
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        if tokens is None and spec.kind != "synthetic":
            tokens = checked_tokens(spec, vocab_size, seq_len, tokenizer)
        self.tokens = tokens

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
    def for_run(cls, spec: RunSpec, cache: Path | None = None) -> "TokenSource":
        """The run's data for its model; cache: the tokens the parent read and checked (`run_tokens`), saved
        in the run folder for every rank (a 1 GB corpus took each rank minutes to tokenize again). A token
        file the parent checked too: each rank maps it without scanning it again."""
        tokens = None
        if cache is not None and cache.is_file():
            tokens = np.load(cache, mmap_mode="r")
        elif cache is not None and spec.data.kind == "tokens":
            tokens = _load_tokens(spec.data, None, lambda done, total: None)
        return cls(spec.data, run_vocab_size(spec), spec.seq_len, spec.seed, tokenizer_folder(spec), tokens)


def tokenizer_folder(spec: RunSpec) -> Path | None:
    """A Hugging Face model's own folder, whose tokenizer its text goes through; None: text is bytes."""
    if not spec.model.is_hf:
        return None
    from offloadlab.workload.hf import hf_folder

    return hf_folder(spec.model.hf_path)


def run_vocab_size(spec: RunSpec) -> int:
    from offloadlab.workload.model import vocab_size

    return vocab_size(spec.model, spec.seq_len)


def checked_tokens(
    spec: DataSpec, vocab_size: int, seq_len: int, tokenizer: Path | None, on_progress: OnProgress | None = None
) -> np.ndarray:
    """The data's token ids, read (and tokenized) once and checked: a SpecError names the file and the fix."""
    tokens = _load_tokens(spec, tokenizer, on_progress or (lambda done, total: None))
    if len(tokens) < seq_len + 2:
        raise SpecError(
            f"data.path {spec.path} holds {len(tokens)} tokens; seq_len + 2 = {seq_len + 2} are needed for one "
            "sample: give more text, or a shorter seq_len"
        )
    if int(tokens.max()) >= vocab_size:
        raise SpecError(f"data.path {spec.path} has token id {int(tokens.max())} >= vocab_size {vocab_size}")
    return tokens


def run_tokens(spec: RunSpec, on_progress: OnProgress | None = None) -> np.ndarray | None:
    """The run's text read, tokenized and checked once, before any process starts; None for data the ranks
    read as it is (synthetic, or a token file, which is checked here too)."""
    if spec.data.kind == "synthetic":
        return None
    tokens = checked_tokens(spec.data, run_vocab_size(spec), spec.seq_len, tokenizer_folder(spec), on_progress)
    return tokens if spec.data.kind == "text" else None


CHUNK_BYTES = 8 << 10
"""A plain text file is tokenized in pieces of about this size, each ending at a line's end, so the
tokenizer's batches run in parallel and progress follows the tokenizer (a batch is 2 MiB). Larger pieces
tokenize slower: 1 MiB pieces took 7x as long as 8 KiB ones with a byte-level BPE (bench/tokenize_corpus.py)."""


def _utf8(raw: bytes, path: Path, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(
            f"data.path {path}: byte {offset + err.start} is not UTF-8 (0x{raw[err.start]:02x}): convert the "
            "file to UTF-8 (iconv -t utf-8), or give token ids with data.kind = \"tokens\""
        ) from None


def documents(path: Path, text_key: str, on_progress: OnProgress) -> Iterator[str]:
    """A .jsonl file's documents (each line's `text_key`), or a text file as one document in pieces that
    end at a line's end."""
    total = path.stat().st_size
    offset = 0
    with path.open("rb") as f:
        if path.suffix != ".jsonl":
            while piece := f.read(CHUNK_BYTES):
                piece += f.readline()  # to the line's end: a character is never cut in two
                yield _utf8(piece, path, offset)
                offset += len(piece)
                on_progress(offset, total)
            return
        for number, line in enumerate(f, 1):
            text = _utf8(line, path, offset)
            offset += len(line)
            if number % 1024 == 0:
                on_progress(offset, total)
            if not text.strip():
                continue
            try:
                yield json.loads(text)[text_key]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SpecError(
                    f"data.path {path} line {number}: not a JSON object with a {text_key!r} field "
                    "(set data.text_key to the field that holds the text)"
                ) from None
    on_progress(total, total)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
"""Any of these is a tokenizer transformers may load: fast (tokenizer.json), SentencePiece, or BPE files."""


def load_tokenizer(folder: Path):
    """The model folder's own tokenizer, never fetched."""
    from transformers import AutoTokenizer

    fix = (
        f"save the model's tokenizer there (tokenizer.save_pretrained(\"{folder}\")), or give token ids with "
        'data.kind = "tokens"'
    )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise SpecError(f'data.kind = "text" needs the model\'s tokenizer, and {folder} holds none: {fix}')
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        first = (str(err).strip() or type(err).__name__).splitlines()[0]
        raise SpecError(f"the tokenizer in {folder} does not load ({first}): {fix}") from None


def tokenize(path: Path, text_key: str, folder: Path, on_progress: OnProgress) -> np.ndarray:
    """Every document's token ids, each followed by the end-of-text token, in one array to pack from; a
    text file's pieces joined without one (it is one document)."""
    tokenizer = load_tokenizer(folder)
    end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    per_document = path.suffix == ".jsonl"
    parts: list[np.ndarray] = []
    docs = documents(path, text_key, on_progress)
    while batch := list(itertools.islice(docs, 256)):  # the tokenizer runs a batch on all cores
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            parts.append(np.asarray(ids + end if per_document else ids, dtype=np.int64))
    if not per_document and parts:
        parts.append(np.asarray(end, dtype=np.int64))
    if not parts:
        raise SpecError(f"data.path {path} holds no documents: give a file with text in it")
    return np.concatenate(parts)


def _load_tokens(spec: DataSpec, tokenizer: Path | None, on_progress: OnProgress) -> np.ndarray:
    if spec.kind == "text":
        if tokenizer is not None:
            return tokenize(spec.path, spec.text_key, tokenizer, on_progress)
        return np.frombuffer(spec.path.read_bytes(), dtype=np.uint8)
    if spec.path.suffix == ".npy":
        return np.load(spec.path, mmap_mode="r")
    return np.memmap(spec.path, dtype=spec.token_dtype, mode="r")
