"""The run's data is read, tokenized and checked once by the parent, before any process starts or any
folder is made: a corpus that cannot train is exit 2 with the file named (and the byte, for bytes that are
not UTF-8), and the ranks read the parent's tokens from the run folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_hf import BATCH, WORDS, save_checkpoint, save_tokenizer, write_corpus

from conftest import cli, write_spec
from offloadlab.spec import DataSpec, SpecError, load_spec
from offloadlab.workload import data
from offloadlab.workload.data import TokenSource, run_tokens

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = save_checkpoint(tmp_path_factory.mktemp("model") / "llama", "llama")
    save_tokenizer(folder)
    return folder


def _jsonl(*texts: str) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


LINE_1 = _jsonl("the model trains")
CORPORA = {
    "short.jsonl": (_jsonl("the model trains on text"), "holds 6 tokens; seq_len + 2 = 34 are needed"),
    "empty.jsonl": (b"", "holds no documents"),
    "blank.jsonl": (b"\n\n  \n", "holds no documents"),
    "latin1.txt": (b"the model\ntrains on \xe9 text\n", "byte 20 is not UTF-8 (0xe9)"),
    "latin1.jsonl": (LINE_1 + b'{"text": "caf\xe9"}\n', f"byte {len(LINE_1) + 13} is not UTF-8 (0xe9)"),
    "nokey.jsonl": (LINE_1 + b'{"body": "the model"}\n', "line 2: not a JSON object with a 'text' field"),
}


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_a_corpus_that_cannot_train_is_refused_before_anything_is_made(tmp_path, model_folder, name):
    content, expected = CORPORA[name]
    (tmp_path / name).write_bytes(content)
    strategies = [dict(name="zero1", engine="deepspeed", zero_stage=1), dict(name="fsdp2", engine="fsdp2")]
    spec = write_spec(
        tmp_path, strategies, **BATCH, model=dict(hf_model=str(model_folder)), data=dict(kind="text", path=name)
    )
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr and name in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_folder_without_a_tokenizer_is_named_with_the_fix(tmp_path):
    folder = save_checkpoint(tmp_path / "llama", "llama")
    write_corpus(tmp_path / "corpus.jsonl")
    spec = write_spec(
        tmp_path,
        [dict(name="fsdp2", engine="fsdp2")],
        **BATCH,
        model=dict(hf_model=str(folder)),
        data=dict(kind="text", path="corpus.jsonl"),
    )
    for verb in (
        ("plan", str(spec), "--gpu-mem", "0", "--tflops", "1"),
        ("run", str(spec), "--out", str(tmp_path / "r")),
    ):
        proc = cli(*verb, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "holds none: save the model's tokenizer there (tokenizer.save_pretrained" in proc.stderr
        assert "Couldn't instantiate" not in proc.stderr
    assert not (tmp_path / "r").exists()


def _text_spec(folder, model_folder, corpus: str):
    """A one-strategy spec training the saved model on the text file `corpus` in folder."""
    strategies = [dict(name="f", engine="fsdp2")]
    data_spec = dict(kind="text", path=corpus)
    return load_spec(write_spec(folder, strategies, **BATCH, model=dict(hf_model=str(model_folder)), data=data_spec))


def test_text_is_tokenized_in_pieces_with_progress_as_one_document(tmp_path, model_folder, monkeypatch):
    """A plain text file is cut at line ends into pieces the tokenizer batches; the tokens are the whole
    file's, and progress reaches the file's size."""
    gen = np.random.default_rng(0)
    lines = [" ".join(gen.choice(WORDS, 9)) for _ in range(400)]
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
    spec = _text_spec(tmp_path, model_folder, "corpus.txt")
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(data, "CHUNK_BYTES", 512)
    pieces = run_tokens(spec, lambda done, total: seen.append((done, total)))
    whole = TokenSource(DataSpec(kind="text", path=tmp_path / "corpus.txt"), 256, 32, 0, tokenizer=model_folder)
    assert len(seen) > 10 and seen[-1] == ((tmp_path / "corpus.txt").stat().st_size,) * 2
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    monkeypatch.setattr(data, "CHUNK_BYTES", 1 << 30)
    assert np.array_equal(pieces, run_tokens(spec)) and np.array_equal(pieces, whole.tokens)


def test_the_ranks_read_the_parents_tokens(tmp_path, model_folder):
    """The cache in the run folder is what a rank trains on, not the corpus read again."""
    write_corpus(tmp_path / "corpus.jsonl")
    spec = _text_spec(tmp_path, model_folder, "corpus.jsonl")
    tokens = run_tokens(spec)
    np.save(tmp_path / "tokens.npy", tokens[::-1].copy())  # a cache unlike the corpus: the rank must read it
    cached = TokenSource.for_run(spec, tmp_path / "tokens.npy")
    assert np.array_equal(cached.tokens, tokens[::-1]) and not np.array_equal(cached.tokens, tokens)


def test_a_token_file_is_checked_once_by_the_parent_and_mapped_by_the_ranks(tmp_path):
    """The parent scans a token file (its length and largest id) before anything starts; each rank maps it
    without scanning it again, and trains on it."""
    tokens = np.random.default_rng(0).integers(0, 256, 4096).astype(np.int32)
    np.save(tmp_path / "ids.npy", tokens)
    spec_path = write_spec(
        tmp_path,
        [dict(name="fsdp2", engine="fsdp2")],
        steps=2,
        verify_checkpoint=False,
        data=dict(kind="tokens", path="ids.npy"),
    )
    cli("run", str(spec_path), "--out", str(tmp_path / "run"))
    np.save(tmp_path / "ids.npy", np.full(64, 10_000, dtype=np.int32))  # now beyond the vocabulary
    with pytest.raises(SpecError, match="token id 10000 >= vocab_size"):
        run_tokens(load_spec(spec_path))
    mapped = TokenSource.for_run(load_spec(spec_path), tmp_path / "run" / "tokens.npy")
    assert int(mapped.tokens.max()) == 10_000  # read as the parent left it: not checked a second time
