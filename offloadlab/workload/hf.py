"""Hugging Face causal LMs from a local folder, the same way into every engine.

`model.hf_model = "DIR"` trains a checkpoint folder (config.json + *.safetensors) from its weights;
`model.hf_config` builds its config with random weights. Nothing is fetched: every read is
`local_files_only`, so a folder that is not complete fails here, by name, and never tries the network.

Why the weights are loaded after the engine builds the model, not by the model's own init:
- Under `deepspeed.zero.Init` (ZeRO-3) every parameter is partitioned as it is created, so transformers'
  `_init_weights` writes into empty shards and the model keeps torch's raw init (embedding std 1.0
  instead of 0.02: a first loss of 91 against 6.6 for the same model elsewhere). So ZeRO-3 gets the
  reference weights copied in, one gathered parameter at a time.
- The model's code must be imported before zero.Init: importing it there pulls in torch._dynamo, which
  trips over the `Tensor.__new__` zero.Init has patched ("Signature mismatch ... tensor_pynew").
  `model_factory` imports everything first and builds later.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from offloadlab.spec import ModelSpec, SpecError

WEIGHTS_INDEX = "model.safetensors.index.json"


def hf_folder(path: Path) -> Path:
    """transformers reads a folder; the spec may name the folder or the config.json in it."""
    return path.parent if path.name == "config.json" else path


def check_hf_folder(path: Path, with_weights: bool) -> None:
    """A folder transformers can build (and, with_weights, load) from without the network, or a SpecError
    that says what is missing."""
    folder, key = hf_folder(path), "model.hf_model" if with_weights else "model.hf_config"
    config = folder / "config.json"
    if not folder.is_dir():
        raise SpecError(
            f"{key} {path}: no such folder (give a local folder with config.json"
            f"{' and *.safetensors' if with_weights else ''}; nothing is downloaded)"
        )
    if not config.is_file():
        raise SpecError(f"{key} {folder} holds no config.json: point it at the model's own folder")
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecError(f"{key} {config} is not valid JSON ({err})") from None
    if not model_type:
        raise SpecError(f"{key} {config} names no model_type: it is not a transformers config")
    if with_weights and not weight_files(folder):
        raise SpecError(
            f"{key} {folder} holds no *.safetensors weights (save it with save_pretrained, "
            "safe_serialization=True), or use model.hf_config for random weights"
        )


def check_hf_model(spec: ModelSpec, reads_text: bool) -> None:
    """What `plan` and `run` both check of a Hugging Face model before any process starts: the folder, a
    model_type transformers builds, weights that fill the model, and (for text data) the tokenizer."""
    check_hf_folder(spec.hf_path, with_weights=spec.hf_model is not None)
    folder = hf_folder(spec.hf_path)
    config = load_config(folder)
    causal_lm_class(config)
    if spec.hf_model is not None:
        check_checkpoint_fills(folder, config)
    if reads_text:
        from offloadlab.workload.data import load_tokenizer

        load_tokenizer(folder)


def weight_files(folder: Path) -> list[Path]:
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        return sorted({folder / name for name in json.loads(index.read_text())["weight_map"].values()})
    return sorted(folder.glob("*.safetensors"))


def load_config(folder: Path):
    try:
        from transformers import AutoConfig
    except ImportError:
        raise SpecError("Hugging Face models need transformers: pip install transformers") from None
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        # transformers' message runs to several lines of advice about upgrading: its first says what is wrong.
        first = (str(err).strip() or type(err).__name__).splitlines()[0]
        raise SpecError(
            f"{folder}: transformers {_transformers_version()} cannot read this config ({first}): "
            "upgrade transformers if it names a model type it does not know"
        ) from None


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def spec_config(spec: ModelSpec):
    """The transformers config of the spec's Hugging Face model."""
    return load_config(hf_folder(spec.hf_path))


def causal_lm_class(config) -> type[nn.Module]:
    """The config's causal-LM class, its module imported now (see the module docstring for why)."""
    import torch._dynamo  # noqa: F401 - imported before zero.Init patches Tensor.__new__
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise SpecError(f"model_type {config.model_type!r} has no causal-LM class in transformers") from None


class HFCausalLM(nn.Module):
    """A transformers causal LM behind the GPT's interface: tokens in, logits out, `blocks` exposed."""

    def __init__(self, model_class: type[nn.Module], config):
        super().__init__()
        self.inner = model_class(config)
        self.blocks = _largest_module_list(self.inner)

    @property
    def activation_checkpointing(self) -> bool:
        return any(getattr(m, "gradient_checkpointing", False) for m in self.inner.modules())

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        """transformers' own checkpointing of each decoder layer, non-reentrant as the GPT's. It re-runs a
        layer through its __call__, so ZeRO-3's gather hooks fire in the recompute too. transformers 5
        renamed the switch (the old name warns); 4.x has only the old one."""
        kwargs = {"use_reentrant": False}
        if hasattr(self.inner, "activation_checkpointing_enable"):
            if on:
                self.inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                self.inner.activation_checkpointing_disable()
        elif on:
            self.inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        else:
            self.inner.gradient_checkpointing_disable()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=tokens, use_cache=False).logits


def _largest_module_list(module: nn.Module) -> nn.ModuleList:
    lists = [m for m in module.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise SpecError(f"{type(module).__name__} has no nn.ModuleList of blocks to shard")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def hf_factory(spec: ModelSpec, seed: int, values_copied_in: bool = False) -> Callable[[], HFCausalLM]:
    """Everything imported and read now; the returned call only builds (under zero.Init if one is open).
    values_copied_in: the engine copies every weight in after the build (ZeRO-3), so transformers' own
    init is skipped: it writes into parameters zero.Init has already partitioned (zeroing the padding row of
    an embedding with pad_token_id set failed with 'index 2 is out of bounds for dimension 0 with size 0')."""
    config = spec_config(spec)
    model_class = causal_lm_class(config)

    def build() -> HFCausalLM:
        torch.manual_seed(seed)
        if not values_copied_in:
            return HFCausalLM(model_class, config)
        with _no_init_weights():
            model = HFCausalLM(model_class, config)
        model.inner.tie_weights()  # part of the init skipped: tied embeddings are one parameter again
        return model

    return build


def _no_init_weights():
    """transformers' own switch for building a model whose weights are loaded afterwards."""
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4
    return no_init_weights()


def meta_model(config) -> HFCausalLM:
    """The model's structure and tensor shapes without memory or init: what the planner counts. A config
    whose values transformers cannot build from (an unknown `hidden_act`, a hidden size its heads do not
    divide) is named here, before any process starts: it was a traceback from inside transformers."""
    model_class = causal_lm_class(config)
    try:
        with torch.device("meta"):
            return HFCausalLM(model_class, config)
    except (KeyError, ValueError) as err:
        raise SpecError(
            f"{config.name_or_path or 'the model'}: transformers cannot build {model_class.__name__} from its "
            f"config.json ({type(err).__name__}: {err}): fix that value in config.json"
        ) from None


class SafetensorsState(Mapping):
    """A checkpoint folder's tensors by name, each read from its file only when asked for."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        self._where: dict[str, Path] = {}
        for path in weight_files(folder):
            with safe_open(str(path), framework="pt") as f:
                self._where.update({name: path for name in f.keys()})

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self._where[name]), framework="pt") as f:
            return f.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def checkpoint_names(folder: Path, model: HFCausalLM) -> set[str]:
    """The names of the model's tensors that the checkpoint's files fill: their own names, or where those
    are not the model's, the names transformers' own key conversion gives them when it loads (it saves
    Mixtral's and Qwen-MoE's experts and GPT-NeoX's head under older names, and fuses experts on load)."""
    keys = set(SafetensorsState(folder))
    if {name for name, _ in model.inner.named_parameters()} <= keys:
        return keys
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:  # transformers 4 loads such checkpoints under their own names
        return keys
    transforms = get_model_conversion_mapping(model.inner)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    meta_state = model.inner.state_dict()
    prefix = model.inner.base_model_prefix
    return {rename_source_key(key, renamings, converters, prefix, meta_state)[0] for key in keys}


def check_checkpoint_fills(folder: Path, config) -> None:
    """Before any process starts: every parameter of the model the config builds is in the checkpoint."""
    model = meta_model(config)
    missing = sorted({name for name, _ in model.inner.named_parameters()} - checkpoint_names(folder, model))
    if missing:
        raise SpecError(
            f"model.hf_model {folder}: its weights lack {len(missing)} of the model's parameters, e.g. "
            f"{missing[:3]}, even under transformers' key conversion: its config.json and its weights do not match"
        )


def converted_state(folder: Path) -> Mapping[str, torch.Tensor]:
    """The checkpoint's tensors under the model's names, as transformers' from_pretrained converts them (on
    the CPU, the whole model at once: only for checkpoints whose own names are not the model's)."""
    config = load_config(folder)
    model = causal_lm_class(config).from_pretrained(folder, local_files_only=True, dtype="auto")
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def initial_state(spec: ModelSpec, seed: int, built_empty: bool) -> Mapping[str, torch.Tensor] | None:
    """The weights a model must start from when its own build does not give them: a checkpoint's always
    (read a tensor at a time where its names are the model's, else converted by transformers);
    for random weights, those of the same seeded build on the CPU when the engine builds the model without
    values (ZeRO-3 partitions each parameter as it is created; FSDP2 builds on the meta device). None: the
    build already holds them (GPT presets init before partitioning)."""
    if spec.hf_model is not None:
        folder = hf_folder(spec.hf_model)
        files = SafetensorsState(folder)
        names = {name for name, _ in meta_model(load_config(folder)).inner.named_parameters()}
        return files if names <= set(files) else converted_state(folder)
    if spec.hf_config is not None and built_empty:
        return {name: t.detach() for name, t in hf_factory(spec, seed)().inner.state_dict().items()}
    return None


def copy_whole(param: torch.Tensor, value: torch.Tensor) -> None:
    param.copy_(value)


def load_initial_state(
    model: HFCausalLM,
    state: Mapping[str, torch.Tensor],
    write: Callable[[torch.Tensor, torch.Tensor], None] = copy_whole,
) -> None:
    """Copy `state` into the model's parameters (tied ones once) and persistent buffers, a tensor at a time.
    `write(param, value)` puts one whole tensor into the engine's parameter: a plain copy, ZeRO-3's gather
    and partition, or FSDP2's own shard of it."""
    named = dict(model.inner.named_parameters())  # tied weights appear once, under their first name
    missing = [name for name in named if name not in state]
    if missing:
        raise SpecError(
            f"the checkpoint lacks {len(missing)} of the model's parameters, e.g. {missing[:3]}: "
            "its config.json and its weights do not match"
        )
    with torch.no_grad():
        for name, param in named.items():
            write(param, state[name])
        for name, buffer in model.inner.named_buffers():
            if name in state:
                buffer.copy_(state[name])


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build a model whose parameters take no memory (the meta device) while its buffers (rotary
    frequencies, which no checkpoint holds) are computed as usual: each parameter moves to the meta device
    as its module registers it, so at most one is ever real (accelerate's init_empty_weights does the same)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register
