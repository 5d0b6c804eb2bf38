"""Checkpoints of the families users bring beyond Llama, saved by transformers' own `save_pretrained` with
`pad_token_id` set (as real Phi, Gemma and GPT-2 checkpoints have it), through plan and every engine: the
first loss is transformers' own on the same batch, and the checkpoint verifies.

ZeRO-3 failed on any config with a pad token (transformers' init zeroed a row of an embedding zero.Init had
partitioned); Mixtral, Qwen3-MoE and GPT-NeoX folders were refused (transformers saves them under older
tensor names and converts on load); GPT-2 and Falcon crashed the planner (no intermediate_size)."""

from __future__ import annotations

import json

import pytest
from test_hf import BATCH, first_losses, reference_first_loss

from conftest import cli, load_bench, write_spec
from offloadlab.results.store import RunStore

transformers = pytest.importorskip("transformers")

FAMILIES = load_bench("hf_families").FAMILIES

ZERO1, ZERO2_CPU, ZERO3_CPU, ZERO3_NVME, FSDP2, FSDP2_CPU_OFFLOAD = load_bench("hf_families").STRATEGIES
OTHERS = [ZERO1, ZERO2_CPU, FSDP2, FSDP2_CPU_OFFLOAD]


def strategies_for(family: str) -> list[dict]:
    """ZeRO-3 for every family (where the pad token broke), CPU and NVMe in turn, and one other engine each
    in turn: every engine meets at least two families, at two runs a family."""
    i = sorted(FAMILIES).index(family)
    return [(ZERO3_CPU, ZERO3_NVME)[i % 2], OTHERS[i % len(OTHERS)]]


save_family = load_bench("hf_families").save_family


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_checkpoint_of_each_family_plans_and_trains_from_its_weights(tmp_path, nvme_root, family):
    folder = save_family(tmp_path / family, family)
    assert json.loads((folder / "config.json").read_text())["pad_token_id"] == 2
    spec = write_spec(tmp_path, strategies_for(family), **BATCH, nvme_path=str(nvme_root), model=dict(hf_model=family))
    planned = json.loads(cli("plan", str(spec), "--json", "--gpu-mem", "0", "--tflops", "1").stdout)
    built = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert sum(planned["shape"]["param_numels"]) == sum(p.numel() for p in built.parameters())
    cli("run", str(spec), "--out", str(tmp_path / "run"))
    reference = reference_first_loss(folder)
    for name, loss in first_losses(tmp_path / "run").items():
        assert loss == pytest.approx(reference, rel=1e-4), name
    store = RunStore(tmp_path / "run")
    assert all(row["checkpoint_verified"] for row in store.strategies(store.run()["id"]))


def test_weights_that_do_not_fill_the_model_are_refused_by_plan_and_run_before_any_process(tmp_path):
    """Renamed tensors (transformers' conversion) pass; a missing one does not, in both commands alike."""
    from safetensors.torch import load_file, save_file

    folder = save_family(tmp_path / "mixtral", "mixtral")
    tensors = load_file(folder / "model.safetensors")
    assert any(".experts.0." in name for name in tensors)  # saved under the old per-expert names
    dropped = next(name for name in tensors if name.endswith("q_proj.weight"))
    del tensors[dropped]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    spec = write_spec(tmp_path, [OTHERS[2]], **BATCH, model=dict(hf_model="mixtral"))
    for args in (
        ("plan", str(spec), "--gpu-mem", "0", "--tflops", "1"),
        ("run", str(spec), "--out", str(tmp_path / "r")),
    ):
        proc = cli(*args, check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        said = proc.stdout + proc.stderr
        assert "its weights lack 1 of the model's parameters" in " ".join(said.split()) and dropped in said
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_model_with_dropout_resumes_exactly(tmp_path):
    """GPT-2 as saved (dropout 0.1 in every block): the restored step draws the same dropout masks as the
    uninterrupted one only with each rank's generators saved in the checkpoint (neither engine saves them;
    the loss differed in the third digit without)."""
    folder = tmp_path / "gpt2"
    transformers.AutoModelForCausalLM.from_config(
        transformers.GPT2Config(vocab_size=256, pad_token_id=2, n_embd=64, n_head=4, n_layer=2, n_positions=128)
    ).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["resid_pdrop"] == 0.1
    spec = write_spec(tmp_path, [OTHERS[0], OTHERS[2]], **BATCH, model=dict(hf_model="gpt2"))
    cli("run", str(spec), "--out", str(tmp_path / "run"))
    store = RunStore(tmp_path / "run")
    rows = store.strategies(store.run()["id"])
    assert [row["checkpoint_verified"] for row in rows] == [1, 1], [row["checkpoint_detail"] for row in rows]


def widened(family: str):
    """The family's config at a width where the planner's narrowing has something to scale: hidden 256,
    four heads of 64 (Falcon's head size follows the hidden size)."""
    config = FAMILIES[family]()
    config.hidden_size = 256
    for field, value in (("head_dim", 64), ("intermediate_size", 512), ("moe_intermediate_size", 128)):
        if getattr(config, field, None) and not isinstance(getattr(type(config), field, None), property):
            setattr(config, field, value)
    if hasattr(config, "max_position_embeddings"):
        config.max_position_embeddings = 1024
    return config


def saved_by_first_layer_per_token(config, seq_len: int) -> float:
    """Bytes autograd keeps for backward while the real model's first decoder layer runs, inside the whole
    model's forward (each storage once, parameters left out), per token."""
    import torch

    from offloadlab.workload.hf import HFCausalLM, causal_lm_class

    torch.manual_seed(0)
    model = HFCausalLM(causal_lm_class(config), config).to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}
    inside = [False]

    def pack(tensor):
        if inside[0] and tensor.untyped_storage().data_ptr() not in params:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    model.blocks[0].register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
    model.blocks[0].register_forward_hook(lambda *_: inside.__setitem__(0, False))
    tokens = torch.randint(0, config.vocab_size, (2, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(tokens)
    return sum(storages.values()) / tokens.numel()


@pytest.mark.parametrize("seq_len", [64, 512])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_planners_activation_bytes_are_what_a_real_layer_saves(family, seq_len):
    """Counted at two narrower widths and solved for the real one; Gemma-2's eager attention grows with
    the sequence (a formula for Llama's layer was 0.55 of it at seq 64 and 0.33 at 256)."""
    from offloadlab.plan.accounting import Shape

    config = widened(family)
    planned = Shape.of_hf(config, seq_len, micro_batch=2, grad_accum=1, precision="bf16")
    measured = saved_by_first_layer_per_token(config, seq_len)
    assert planned.block_activation_bytes_per_token == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_with_activation_checkpointing_the_planner_counts_what_each_layer_keeps(family):
    """transformers' own checkpointing, as a run turns it on: each further layer keeps its input only,
    whatever the family; the planner's checkpointed activations grow by exactly that a layer."""
    import torch

    from offloadlab.plan.accounting import Shape, activation_bytes
    from offloadlab.plan.activations import _with_layers
    from offloadlab.workload.hf import HFCausalLM, causal_lm_class

    def saved(config) -> int:
        torch.manual_seed(0)
        model = HFCausalLM(causal_lm_class(config), config).to(torch.bfloat16)
        model.activation_checkpointing = True
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages: dict[int, int] = {}

        def pack(tensor):
            if tensor.untyped_storage().data_ptr() not in params:
                storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(torch.randint(0, config.vocab_size, (2, 64)))
        return sum(storages.values())

    one, two = (_with_layers(widened(family), n) for n in (1, 2))
    planned = [activation_bytes(Shape.of_hf(c, 64, 2, 1, "bf16"), checkpointing=True) for c in (one, two)]
    assert planned[1] - planned[0] == saved(two) - saved(one) > 0
