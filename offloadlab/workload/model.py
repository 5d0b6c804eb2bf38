"""The models offloadlab trains: built-in GPT presets, and Hugging Face models from a local folder (hf.py).

Both engines get the same module tree from `build_model`: `blocks` (an nn.ModuleList) is what FSDP2 shards
one by one and what activation checkpointing wraps. Initialisation happens inside each leaf's
`reset_parameters`, so it runs before `deepspeed.zero.Init` partitions a leaf, and the same seed gives the same
weights whether or not the model is built under zero.Init.
"""

from __future__ import annotations

import bisect
import difflib
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from offloadlab.spec import ModelSpec, SpecError


@dataclass(frozen=True)
class GPTConfig:
    d_model: int
    n_layers: int
    n_heads: int
    vocab_size: int
    max_seq_len: int = 1024
    mlp_ratio: int = 4

    def param_numels(self) -> list[int]:
        """Elements of each parameter tensor, in the model's order (the planner needs their sizes, not just
        the sum)."""
        d, r, v = self.d_model, self.mlp_ratio, self.vocab_size
        ln, qkv, proj, fc, fc_out = [d, d], [3 * d * d, 3 * d], [d * d, d], [r * d * d, r * d], [r * d * d, d]
        block = [*ln, *qkv, *proj, *ln, *fc, *fc_out]
        return [v * d, self.max_seq_len * d, *block * self.n_layers, d, d, v * d]

    @property
    def n_params(self) -> int:
        return sum(self.param_numels())

    @property
    def largest_param_numel(self) -> int:
        return max(self.param_numels())


# Presets by parameter count; shapes follow GPT-2/GPT-3 (untied embeddings, vocab padded to 50304).
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(d_model=64, n_layers=2, n_heads=4, vocab_size=256),
    "small-cpu": GPTConfig(d_model=256, n_layers=4, n_heads=4, vocab_size=4096),
    "gpt-125m": GPTConfig(d_model=768, n_layers=12, n_heads=12, vocab_size=50304),
    "gpt-350m": GPTConfig(d_model=1024, n_layers=24, n_heads=16, vocab_size=50304),
    "gpt-760m": GPTConfig(d_model=1536, n_layers=24, n_heads=16, vocab_size=50304),
    "gpt-1.4b": GPTConfig(d_model=2048, n_layers=24, n_heads=16, vocab_size=50304),
    "gpt-2.7b": GPTConfig(d_model=2560, n_layers=32, n_heads=32, vocab_size=50304),
    "gpt-6.7b": GPTConfig(d_model=4096, n_layers=32, n_heads=32, vocab_size=50304),
    "gpt-13b": GPTConfig(d_model=5120, n_layers=40, n_heads=40, vocab_size=50304),
    "gpt-30b": GPTConfig(d_model=7168, n_layers=48, n_heads=56, vocab_size=50304),
    "gpt-70b": GPTConfig(d_model=8192, n_layers=80, n_heads=64, vocab_size=50304),
}

# GPT-3's learning rates by size (Brown et al. 2020, table 2.1): what a spec `plan` writes for a preset or
# for `--largest` trains with. The spec default, 1e-3, is the 125M models' rate doubled; with it the 7.7B runs
# of the 24 and 48 GiB grids ended their third step above their first loss (3 steps of synthetic data: a
# hint, not a measured divergence).
GPT3_LEARNING_RATES = ((125e6, 6e-4), (350e6, 3e-4), (760e6, 2.5e-4), (1.3e9, 2e-4), (2.7e9, 1.6e-4),
                       (6.7e9, 1.2e-4), (13e9, 1e-4), (175e9, 0.6e-4))  # fmt: skip


def gpt3_learning_rate(n_params: int) -> float:
    """GPT-3's rate for this many parameters, between its sizes on a log-log line, held at its ends."""
    sizes = [math.log(n) for n, _ in GPT3_LEARNING_RATES]
    rates = [math.log(r) for _, r in GPT3_LEARNING_RATES]
    x = min(max(math.log(n_params), sizes[0]), sizes[-1])
    i = max(1, bisect.bisect_left(sizes, x))
    t = (x - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
    return round(math.exp(rates[i - 1] + t * (rates[i] - rates[i - 1])), 7)


INIT_CHUNK = 1 << 22
"""Elements one generator fills: the weights depend on the seed and this, not on how many threads fill them."""


def _init_normal(weight: torch.Tensor) -> None:
    # Drawn on the CPU whatever the parameter's device, so a model built on the GPU under zero.Init gets the
    # same weights as one built on the CPU for FSDP2. A meta model (sizing) has no values. One CPU generator
    # fills about 80M values a second (the CI machine): 90 s for the 7.67B GPT of the 24 GiB budget run, whose
    # workers took 136 s to their first step on an H200 host. Each tensor takes one seed from the seeded
    # global generator, in build order, and its chunks are filled in parallel.
    if weight.is_meta:
        return
    seed = int(torch.randint(2**62, ()).item())
    in_place = weight.device.type == "cpu" and weight.is_contiguous()
    values = weight.detach().view(-1) if in_place else torch.empty(weight.numel(), device="cpu")
    chunks = values.split(INIT_CHUNK)

    def fill(i: int) -> None:
        chunks[i].normal_(std=0.02, generator=torch.Generator().manual_seed(seed + i))

    with ThreadPoolExecutor(min(len(chunks), torch.get_num_threads())) as pool:
        list(pool.map(fill, range(len(chunks))))
    if not in_place:
        with torch.no_grad():
            weight.copy_(values.view(weight.shape))


class Linear(nn.Linear):
    def reset_parameters(self) -> None:
        _init_normal(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        _init_normal(self.weight)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        self.qkv = Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = Linear(cfg.d_model, cfg.d_model)
        self.ln_mlp = nn.LayerNorm(cfg.d_model)
        self.fc = Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.fc_out = Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).view(batch, seq, 3, self.n_heads, d // self.n_heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln_mlp(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.activation_checkpointing = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.activation_checkpointing else block(x)
        return self.lm_head(self.ln_f(x))


def _size(name: str) -> float | None:
    """The parameters a name like "gpt-1.3b" or "gpt-350m" says."""
    match = re.fullmatch(r"gpt-(\d+(?:\.\d+)?)([mb])", name.lower())
    return float(match[1]) * (1e9 if match[2] == "b" else 1e6) if match else None


def _nearest_preset(name: str) -> str | None:
    """By size for a sized name (gpt-1.3b: gpt-1.4b, where spelling alone says gpt-13b), else by spelling."""
    wanted = _size(name)
    sized = {p: _size(p) for p in PRESETS if _size(p)}
    if wanted:
        return min(sized, key=lambda p: abs(math.log(sized[p] / wanted)))
    return next(iter(difflib.get_close_matches(name, PRESETS, n=1)), None)


def gpt_config(spec: ModelSpec, seq_len: int) -> GPTConfig:
    """The GPT shape for a spec: a preset with any explicit fields overriding it."""
    base = PRESETS.get(spec.preset) if spec.preset else None
    if spec.preset and base is None:
        nearest = _nearest_preset(spec.preset)
        hint = f"did you mean {nearest!r}? " if nearest else ""
        raise SpecError(f"model.preset {spec.preset!r} is unknown: {hint}presets: {', '.join(PRESETS)}")
    fields = {k: getattr(spec, k) for k in ("d_model", "n_layers", "n_heads", "vocab_size") if getattr(spec, k)}
    merged = {**(base.__dict__ if base else {}), **fields, "max_seq_len": seq_len}
    cfg = GPTConfig(**merged)
    if cfg.d_model % cfg.n_heads:
        raise SpecError(f"model.d_model = {cfg.d_model} must be divisible by model.n_heads = {cfg.n_heads}")
    return cfg


def model_factory(spec: ModelSpec, seq_len: int, seed: int, values_copied_in: bool = False) -> Callable[[], nn.Module]:
    """A call that builds the spec's model on the current default device (under zero.Init each leaf is
    partitioned once built). Config files are read and model code imported now, before any zero.Init.
    values_copied_in: the engine copies a Hugging Face model's weights in afterwards (see hf_factory)."""
    if spec.is_hf:
        from offloadlab.workload.hf import hf_factory

        build = hf_factory(spec, seed, values_copied_in)
    else:
        cfg = gpt_config(spec, seq_len)

        def build() -> nn.Module:
            torch.manual_seed(seed)
            return GPT(cfg)

    def build_with_checkpointing() -> nn.Module:
        model = build()
        model.activation_checkpointing = spec.activation_checkpointing
        return model

    return build_with_checkpointing


def build_model(spec: ModelSpec, seq_len: int, seed: int) -> nn.Module:
    return model_factory(spec, seq_len, seed)()


def vocab_size(spec: ModelSpec, seq_len: int) -> int:
    if spec.is_hf:
        from offloadlab.workload.hf import spec_config

        return spec_config(spec).vocab_size
    return gpt_config(spec, seq_len).vocab_size


def model_numbers(model: nn.Module) -> tuple[int, int, int]:
    """(parameters, layers, hidden size) of a built model, counting ZeRO-3 partitioned params at full size."""
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        return n_params, cfg.n_layers, cfg.d_model
    inner = model.inner.config
    return n_params, len(model.blocks), int(getattr(inner, "hidden_size", getattr(inner, "n_embd", 0)))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
