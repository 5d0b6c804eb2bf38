"""Model presets and data addressing."""

from __future__ import annotations

import json

import pytest
import torch

from offloadlab.spec import DataSpec, ModelSpec
from offloadlab.workload.data import TokenSource
from offloadlab.workload.model import INIT_CHUNK, PRESETS, build_model, gpt_config


def test_preset_sizes():
    assert PRESETS["gpt-1.4b"].n_params == pytest.approx(1.42e9, rel=0.01)
    assert PRESETS["gpt-70b"].n_params == pytest.approx(65e9, rel=0.05)
    model = build_model(ModelSpec(preset="tiny"), seq_len=32, seed=0)
    assert sum(p.numel() for p in model.parameters()) == gpt_config(ModelSpec(preset="tiny"), 32).n_params


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = (build_model(ModelSpec(preset="tiny"), 32, seed) for seed in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_weights_are_the_same_however_many_threads_fill_them_and_are_drawn_from_a_normal():
    """Each weight's chunks are filled in parallel (one generator: about 90 s for a 7.7B GPT)."""
    spec = ModelSpec(d_model=512, n_layers=1, n_heads=8, vocab_size=16384)  # embedding: 2 chunks of INIT_CHUNK
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = build_model(spec, 32, seed=0)
        torch.set_num_threads(4)
        four = build_model(spec, 32, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(x, y) for x, y in zip(one.state_dict().values(), four.state_dict().values()))
    emb = one.tok_emb.weight.detach().view(-1)
    assert emb.numel() > INIT_CHUNK
    first, second = emb[:INIT_CHUNK], emb[INIT_CHUNK:]
    assert not torch.equal(first[: second.numel()], second)  # each chunk its own stream
    assert emb.std().item() == pytest.approx(0.02, rel=0.01) and abs(emb.mean().item()) < 1e-4


def test_a_step_has_the_same_samples_however_ranks_and_accumulation_split_it():
    source = TokenSource(DataSpec(), vocab_size=256, seq_len=16, seed=3)
    one_rank = torch.cat(
        [b.inputs for b in source.micro_batches(step=5, rank=0, world=1, micro_batch=2, grad_accum=4)]
    )
    two_ranks = [source.micro_batches(step=5, rank=r, world=2, micro_batch=2, grad_accum=2) for r in (0, 1)]
    split = torch.cat([torch.cat([b.inputs for b in two_ranks[r]]) for r in (0, 1)])
    assert sorted(map(tuple, one_rank.tolist())) == sorted(map(tuple, split.tolist()))
    assert not torch.equal(one_rank, torch.cat([b.inputs for b in source.micro_batches(6, 0, 1, 2, 4)]))


def test_targets_are_inputs_shifted_by_one():
    batch = TokenSource(DataSpec(), 256, 16, 0).micro_batches(0, 0, 1, 2, 1)[0]
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])


def test_text_file_data(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("offloadlab " * 100)
    source = TokenSource(DataSpec(kind="text", path=path), vocab_size=256, seq_len=8, seed=0)
    assert bytes(source.sample(0).tolist()[:8]) == b"offloadl"


def test_token_ids_beyond_the_vocabulary_are_rejected(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("é" * 100)
    with pytest.raises(ValueError, match="token id 195 >= vocab_size 128"):
        TokenSource(DataSpec(kind="text", path=path), vocab_size=128, seq_len=8, seed=0)


@pytest.mark.slow
def test_hugging_face_config_builds_without_weights(tmp_path):
    pytest.importorskip("transformers")
    config = dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        max_position_embeddings=64,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = build_model(ModelSpec(hf_config=tmp_path / "config.json"), seq_len=16, seed=0)
    assert len(model.blocks) == 2
    assert model(torch.randint(0, 256, (2, 16))).shape == (2, 16, 256)


@pytest.mark.parametrize("preset", ["tiny", "small-cpu"])
def test_the_planners_parameter_list_is_the_built_models(preset):
    from offloadlab.spec import ModelSpec
    from offloadlab.workload.model import build_model, gpt_config

    spec = ModelSpec(preset=preset)
    assert gpt_config(spec, 64).param_numels() == [p.numel() for p in build_model(spec, 64, 0).parameters()]
