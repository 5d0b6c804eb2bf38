"""Bytes one decoder block of a Hugging Face model saves for backward, per token, counted on the model's
own code rather than a formula per family: Gemma-2's eager attention keeps its score matrix (and so grows
with the sequence), GPT-NeoX keeps its parallel branches, an MoE block its routed tokens.

The model is built at a reduced width on the CPU and run forward at the spec's sequence length, with
autograd's saved-tensor hooks counting each saved storage once (parameters left out); one block is the
difference between the model with two layers and with one. The bytes a block saves are a sum of terms
that grow with the width (hidden, head and MLP sizes) and terms that do not (per-head statistics, router
logits, score matrices): counted at two widths, the sum is solved for both parts and taken at the real
width, exactly. Routing is data-dependent, but every token goes to top-k experts, so what an MoE block
saves does not depend on where it goes."""

from __future__ import annotations

import copy
import functools
import json

import torch

WIDTH_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "ffn_hidden_size",
    "n_inner",
    "head_dim",
)
"""Config fields that are widths, under each family's name (GPT-2's n_embd is hidden_size through its
attribute map); scaled down together, the number of heads and experts kept."""

SMALL_VOCAB = 256
SMALL_HEAD_DIMS = (8, 16)
"""The head sizes counted at: even (rotary embeddings), and small enough to be quick at any width."""


def block_saved_bytes_per_token(config, seq_len: int, precision: str) -> int:
    """What one decoder block saves for backward per token, at seq_len in the run's precision."""
    key = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return _counted(key, type(config), seq_len, precision)


@functools.lru_cache(maxsize=32)
def _counted(config_json: str, config_class, seq_len: int, precision: str) -> int:
    config = config_class.from_dict(json.loads(config_json))
    head_dim = _head_dim(config)
    factors = sorted({head_dim // d for d in SMALL_HEAD_DIMS if head_dim % d == 0 and head_dim // d >= 1})
    if len(factors) < 2:  # a head already this small: counted at its own width
        return round(_one_block(config, seq_len, precision) / seq_len)
    f1, f2 = factors[-1], factors[-2]
    b1 = _one_block(_narrowed(config, f1), seq_len, precision)
    b2 = _one_block(_narrowed(config, f2), seq_len, precision)
    grows_with_width = (b1 - b2) / (1 / f1 - 1 / f2)
    fixed = b1 - grows_with_width / f1
    return round((grows_with_width + fixed) / seq_len)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _narrowed(config, factor: int):
    narrow = copy.deepcopy(config)
    for field in WIDTH_FIELDS:
        value = getattr(config, field, None)
        derived = isinstance(getattr(type(config), field, None), property)  # Falcon's head_dim follows hidden
        if isinstance(value, int) and value and not derived:
            setattr(narrow, field, value // factor)
    return narrow


def _with_layers(config, n: int):
    """The config with n decoder layers of its first layer's kind (Gemma's sliding and full layers alike
    are counted as its first)."""
    out = copy.deepcopy(config)
    out.num_hidden_layers = n
    # A small vocabulary: the embedding and the logits are outside the blocks, and a 256k vocabulary's
    # logits at a long sequence would take a GiB here for nothing.
    out.vocab_size = SMALL_VOCAB
    for token in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(out, token, None), int) and getattr(out, token) >= SMALL_VOCAB:
            setattr(out, token, None)
    types = getattr(config, "layer_types", None)
    if types:
        out.layer_types = [types[0]] * n
    return out


def _one_block(config, seq_len: int, precision: str) -> int:
    return _saved_bytes(_with_layers(config, 2), seq_len, precision) - _saved_bytes(
        _with_layers(config, 1), seq_len, precision
    )


def _saved_bytes(config, seq_len: int, precision: str) -> int:
    from offloadlab.workload.hf import HFCausalLM, causal_lm_class

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(0)
    model = HFCausalLM(causal_lm_class(config), config).to(dtype)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    tokens = torch.randint(0, config.vocab_size, (1, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(tokens)
    del logits
    return sum(storages.values())
