"""`offloadlab plan`: model-state formulas against DeepSpeed's own estimators, feasibility, ranking, and
the files `--write` emits loaded by the tools that read them."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import tomllib
from pathlib import Path

import pytest
import tomli_w
import yaml
from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
from rich.console import Console

from conftest import cli, flat, load_bench, write_spec
from offloadlab.autotune.space import search_space
from offloadlab.engines import engine_for
from offloadlab.engines.deepspeed import planner as deepspeed
from offloadlab.engines.deepspeed.buffers import buffers_for, sub_groups, swap_buffer_bytes
from offloadlab.engines.fsdp2 import planner as fsdp2
from offloadlab.plan.accounting import GiB, Links, Machine, Placement, Shape, shape_of_spec
from offloadlab.plan.inputs import PlanInputs, PlanRequest
from offloadlab.plan.output import not_planned, not_planned_text, plan_table
from offloadlab.plan.predict import candidate_placements, plan, predict, predict_step, why_not_runnable, why_winner
from offloadlab.spec import DeepSpeedStrategy, FSDP2Strategy, TorchAOStrategy, load_spec
from offloadlab.workload.model import GPT3_LEARNING_RATES, PRESETS, GPTConfig, gpt3_learning_rate


def _zero(
    name: str,
    stage: int,
    optimizer: str = "none",
    param: str = "none",
    activation_checkpointing: bool = False,
    **fields,
) -> Placement:
    strategy = DeepSpeedStrategy(
        name=name, engine="deepspeed", zero_stage=stage, offload_optimizer=optimizer, offload_param=param, **fields
    )
    return Placement(strategy, activation_checkpointing)


def _fsdp2(name: str, cpu_offload: bool = False) -> Placement:
    return Placement(FSDP2Strategy(name=name, engine="fsdp2", cpu_offload=cpu_offload))


def step_bytes(placement: Placement, shape: Shape, world: int) -> dict[str, float]:
    return engine_for(placement.strategy).planner.step_bytes(placement, shape, world)


STATES = ("parameters", "gradients", "optimizer states", "gathered layer")


def _model_state_bytes(memory, place: str) -> float:
    return sum(v for k, v in getattr(memory, place).items() if k in STATES)


def _shape(preset: str, precision: str = "bf16", **batch) -> Shape:
    return Shape.of(
        PRESETS[preset], batch.get("seq_len", 1024), batch.get("micro_batch", 4), batch.get("grad_accum", 1), precision
    )


@pytest.mark.parametrize("preset", ["gpt-125m", "gpt-1.4b", "gpt-13b"])
@pytest.mark.parametrize("world", [1, 2, 8])
def test_model_states_match_deepspeeds_own_estimates(preset, world):
    shape = _shape(preset)
    n, largest = shape.n_params, shape.largest_param_numel
    cases = [
        # (our placement, DeepSpeed's estimate (cpu_bytes, gpu_bytes) for one host of `world` GPUs)
        (_zero("z2", 2), estimate_zero2_model_states_mem_needs(n, world, cpu_offload=False)),
        (_zero("z2c", 2, "cpu"), estimate_zero2_model_states_mem_needs(n, world, cpu_offload=True)),
        (_zero("z3", 3), estimate_zero3_model_states_mem_needs(n, largest, world, cpu_offload=False)[:2]),
        (
            _zero("z3c", 3, "cpu"),
            estimate_zero3_model_states_mem_needs(n, largest, world, cpu_offload=True, cpu_offload_params=False)[:2],
        ),
        (
            _zero("z3cc", 3, "cpu", "cpu"),
            estimate_zero3_model_states_mem_needs(n, largest, world, cpu_offload=True, cpu_offload_params=True)[:2],
        ),
    ]
    for placement, (ds_cpu, ds_gpu) in cases:
        ours = deepspeed.model_states(placement, shape, world)
        if world == 1 and placement.strategy.zero_stage == 3 and placement.strategy.offload_param == "none":
            ds_gpu -= 4 * largest  # its largest_layer_memory: a gathered copy one rank does not make (measured)
        assert _model_state_bytes(ours, "gpu") == pytest.approx(ds_gpu, rel=1e-6, abs=world), placement.name
        # DeepSpeed's CPU figure is per host with a 1.5x buffer factor; with zero.Init (stage 3) or once the
        # fp32 build copy is freed (stage 2: the larger of 4 bytes x ranks and the 16-byte states).
        host_states = (_model_state_bytes(ours, "host_pinned") + _model_state_bytes(ours, "host_pageable")) * world
        if placement.strategy.zero_stage == 2 and placement.strategy.offload_optimizer == "cpu":
            host_states = max(host_states, 4 * n * world)
        if placement.strategy.offload_optimizer != "none":
            assert host_states == pytest.approx(ds_cpu / 1.5, rel=1e-6), placement.name


LINKS = Links(
    nvme_read=2e9,
    nvme_write=2.5e9,
    nvme_source="test",
    pcie_h2d=50e9,
    pcie_d2h=50e9,
    cpu_adam_params_per_s=1e9,
    torch_cpu_adam_params_per_s=2e8,
    device_adam_params_per_s=20e9,
    device_fused_adam_params_per_s=40e9,
    host_passes_params_per_s=4e9,
    flops_per_s=400e12,
    flops_source="test",
)


def test_the_binding_constraint_is_named_and_offload_rescues_a_model_the_gpu_cannot_hold():
    # 6.7B at 4 x 1024 tokens: its activations alone need 18 GiB, so offload needs checkpointing beside it.
    shape = _shape("gpt-6.7b")
    machine = Machine(gpus=1, gpu_mem_bytes=24 * GiB, host_mem_bytes=256 * GiB, nvme_free_bytes=500 * GiB)
    plain = predict(_zero("zero2", 2), shape, machine, LINKS)
    assert not plain.fits and plain.binding.startswith("GPU memory: ")
    offloaded = predict(
        _zero("zero3-opt-cpu-param-cpu+ac", 3, "cpu", "cpu", activation_checkpointing=True), shape, machine, LINKS
    )
    assert offloaded.fits and offloaded.step.bottleneck in offloaded.step.parts
    ranked = plan(shape, machine, LINKS)
    feasible = [x for x in ranked if x.fits]
    assert feasible and all(x.fits for x in ranked[: len(feasible)])
    assert [x.step.seconds for x in feasible] == sorted(x.step.seconds for x in feasible)
    assert why_winner(ranked).startswith(f"{feasible[0].placement.name} wins")
    # Too little disk for the optimizer's 16 bytes a parameter: NVMe placements say so.
    small_disk = Machine(gpus=1, gpu_mem_bytes=24 * GiB, host_mem_bytes=64 * GiB, nvme_free_bytes=10 * GiB)
    nvme = predict(_zero("z3n", 3, "nvme", "nvme"), shape, small_disk, LINKS)
    assert not nvme.fits and nvme.binding.startswith("NVMe space: ")


def test_nothing_fits_ends_with_what_would_make_the_nearest_placement_fit():
    """The nearest placement is the one fewest GiB short; the memory it names is what makes it fit."""
    import re

    shape = _shape("gpt-6.7b")
    machine = Machine(gpus=1, gpu_mem_bytes=24 * GiB, host_mem_bytes=48 * GiB, nvme_free_bytes=None)
    ranked = plan(shape, machine, LINKS)
    assert not any(x.fits for x in ranked)
    said = why_winner(ranked)
    name, gib, what = re.search(
        r"Nearest to fitting: (\S+), with ([\d.]+) GiB more (host RAM|GPU memory|NVMe space)", said
    ).groups()
    assert "plan --largest" in said
    nearest = next(x for x in ranked if x.placement.name == name)
    assert sum(nearest.short_bytes) == min(sum(x.short_bytes) for x in ranked)
    grown = dataclasses.replace(machine, host_mem_bytes=machine.host_mem_bytes + (float(gib) + 0.1) * GiB)
    assert what == "host RAM" and predict(nearest.placement, shape, grown, LINKS).fits


def test_an_nvme_placement_does_not_fit_without_an_nvme_folder_even_with_nothing_to_swap():
    """The tiny GPT's parameters all stay resident under ZeRO-3's persistence threshold, so nothing of
    zero3-opt-cpu-param-nvme goes to NVMe; DeepSpeed still makes its swapper, which needs a folder. The plan
    listed it as fitting with 0.0 GiB of NVMe when none was given."""
    shape = _shape("tiny")
    p = _zero("zero3-opt-cpu-param-nvme", 3, "cpu", "nvme")
    no_folder = Machine(gpus=1, gpu_mem_bytes=24 * GiB, host_mem_bytes=64 * GiB, nvme_free_bytes=None)
    alone = predict(p, shape, no_folder, LINKS)
    assert alone.memory.nvme_bytes == 0
    assert not alone.fits and alone.constraints == ("NVMe space",) and "--nvme" in alone.binding
    with_folder = dataclasses.replace(no_folder, nvme_free_bytes=100 * GiB)
    assert predict(p, shape, with_folder, LINKS).fits
    ranked = plan(shape, no_folder, LINKS)
    assert not any(x.fits for x in ranked if x.placement.strategy.uses_nvme)
    assert "NVMe space 0.0 GiB (no NVMe folder given" in plan_table(ranked, "tiny", no_folder).caption


def test_a_spec_written_for_a_preset_or_the_largest_trains_at_gpt3s_rate_for_its_size(tmp_path):
    """The spec default, 1e-3, is twice GPT-3's rate at 125M: plan writes GPT-3's rate for the model's size
    where it made the spec itself (a preset, --largest), and a user's own spec keeps its rate."""
    for n_params, rate in GPT3_LEARNING_RATES:
        assert gpt3_learning_rate(int(n_params)) == pytest.approx(rate, rel=1e-4)
    sizes = [1e6, 125e6, 500e6, 1.42e9, 7.67e9, 70e9, 175e9, 1e12]
    rates = [gpt3_learning_rate(int(n)) for n in sizes]
    assert rates == sorted(rates, reverse=True) and rates[0] == 6e-4 and rates[-1] == 6e-5
    console = Console(file=io.StringIO())
    request = PlanRequest(preset="gpt-1.4b", gpu_mem_gib=24, host_mem_gib=64, tuned_dir=tmp_path)
    inputs = PlanInputs.gather(request, console, links=LINKS)
    assert 1.9e-4 < inputs.spec.lr < 2e-4  # 1.42B, between GPT-3's 1.3B (2e-4) and 2.7B (1.6e-4)
    largest = inputs.with_model(GPTConfig(d_model=4096, n_layers=36, n_heads=32, vocab_size=50304), "largest")
    assert largest.spec.lr == gpt3_learning_rate(largest.shape.n_params) and 1.1e-4 < largest.spec.lr < 1.2e-4
    own = write_spec(tmp_path, [dict(name="f", engine="fsdp2")], lr=3e-3)
    assert PlanInputs.gather(PlanRequest(spec_path=own, tuned_dir=tmp_path), console, links=LINKS).spec.lr == 3e-3


def test_what_does_not_fit_names_every_constraint_it_breaks_the_worst_first():
    """Session 15's H200 run one layer past the 24 GiB largest (7.87B, FSDP2 + CPUOffloadPolicy) broke both the
    GPU share and host RAM; the plan named only the GPU, and the kernel's OOM killer ended it on host RAM."""
    shape = _shape("gpt-6.7b")
    offload = _fsdp2("fsdp2-cpu-offload", cpu_offload=True)
    m = predict(offload, shape, Machine(gpus=1, gpu_mem_bytes=1e15, host_mem_bytes=1e15, nvme_free_bytes=None), LINKS)
    gpu, host = m.memory.gpu_bytes, m.memory.host_bytes
    # GPU 10% over its usable share, host RAM 5% over: both named, the GPU first.
    both = Machine(gpus=1, gpu_mem_bytes=gpu / 1.1 / 0.9, host_mem_bytes=host / 1.05, nvme_free_bytes=None)
    broke = predict(offload, shape, both, LINKS)
    assert not broke.fits
    gpu_part, host_part = broke.binding.split("; ")
    assert gpu_part.startswith("GPU memory: ") and host_part.startswith("host RAM: ")
    # Host RAM alone over: only it; everything holds: the tightest alone.
    host_only = predict(offload, shape, dataclasses.replace(both, gpu_mem_bytes=2 * gpu), LINKS)
    assert not host_only.fits and host_only.binding.startswith("host RAM: ") and ";" not in host_only.binding
    roomy = predict(offload, shape, dataclasses.replace(both, gpu_mem_bytes=2 * gpu, host_mem_bytes=1.2 * host), LINKS)
    assert roomy.fits and roomy.binding.startswith("host RAM: ") and ";" not in roomy.binding


@pytest.mark.parametrize("placement", [_zero("zero2-cpu", 2, "cpu"), _fsdp2("fsdp2-cpu-offload", cpu_offload=True)])
def test_a_cpu_optimizer_step_pays_adam_and_the_host_passes_after_backward_and_the_hand_off_in_it(placement):
    shape = _shape("gpt-1.4b")
    adam_rate = (
        LINKS.cpu_adam_params_per_s if placement.strategy.engine == "deepspeed" else LINKS.torch_cpu_adam_params_per_s
    )
    # FSDP2's CPU step runs slower than the probes on the H200 hosts (measured, FSDP2_CPU_STEP_OVER_PROBES)
    slower = fsdp2.FSDP2_CPU_STEP_OVER_PROBES["torch"] if placement.strategy.engine == "fsdp2" else 1.0
    bound = predict_step(placement, shape, 1, LINKS)
    assert bound.parts["cpu_adam"] == pytest.approx(slower * shape.n_params / adam_rate)
    assert bound.parts["host_passes"] == pytest.approx(slower * shape.n_params / LINKS.host_passes_params_per_s)
    # DeepSpeed copies the updated bf16 parameters back to the GPU after the step, not during backward;
    # FSDP2's offloaded shards stay on the host.
    upload = 2 * shape.n_params / LINKS.pcie_h2d if placement.strategy.engine == "deepspeed" else 0.0
    assert bound.parts.get("param_upload", 0.0) == pytest.approx(upload)
    # DeepSpeed's backward waits on each gradient's hand-off to its fp32 buffer on the host, one host pass;
    # FSDP2 copies the reduced shards asynchronously.
    handoff = shape.n_params / LINKS.host_passes_params_per_s if placement.strategy.engine == "deepspeed" else None
    assert bound.parts.get("grad_handoff") == (None if handoff is None else pytest.approx(handoff))
    in_training = ("grad_handoff", "fsdp2_hooks")  # host work forward and backward wait on
    serial = ("cpu_adam", "host_passes", "param_upload", *in_training)
    overlapped = max(v for k, v in bound.parts.items() if k not in serial)
    assert bound.training_s == pytest.approx(overlapped + sum(bound.parts.get(k, 0.0) for k in in_training))
    assert bound.seconds == pytest.approx(overlapped + sum(bound.parts.get(k, 0.0) for k in serial))


@pytest.mark.parametrize(
    "placement, rate",
    [(_fsdp2("fsdp2"), LINKS.device_adam_params_per_s), (_zero("zero2", 2), LINKS.device_fused_adam_params_per_s)],
)
def test_an_optimizer_on_the_gpu_adds_its_step_after_backward(placement, rate):
    """FSDP2's foreach AdamW and DeepSpeed's FusedAdam stream every state through GPU memory once a step."""
    shape = _shape("gpt-1.4b")
    bound = predict_step(placement, shape, 1, LINKS)
    assert bound.parts["device_adam"] == pytest.approx(shape.n_params / rate)
    hooks = bound.parts.get("fsdp2_hooks", 0.0)  # FSDP2's 24 blocks and root at 1.42B; ZeRO-2 adds none
    units = shape.n_layers + 1 if placement.strategy.engine == "fsdp2" else 0
    assert hooks == pytest.approx(units * fsdp2.FSDP2_HOOK_S_PER_UNIT)
    assert bound.seconds == pytest.approx(bound.parts["compute"] + hooks + bound.parts["device_adam"])


def test_fsdp2_peaks_in_the_optimizer_step_or_at_the_turn_whichever_holds_more():
    """Without offload the gradients and AdamW's foreach temporary (8 bytes a parameter) exist only in the
    step, when the activations are gone; a longer sequence moves the peak to the forward/backward turn."""
    machine = Machine(gpus=1, gpu_mem_bytes=140 * GiB, host_mem_bytes=256 * GiB, nvme_free_bytes=None)
    turns = {}
    for seq_len in (256, 4096):
        shape = _shape("gpt-1.4b", seq_len=seq_len)
        m = predict(_fsdp2("fsdp2"), shape, machine, LINKS).memory
        turns[seq_len], step = sum(m.gpu_turn.values()), sum(m.gpu_step.values())
        assert step == pytest.approx(8 * shape.n_params)
        assert m.gpu_bytes == pytest.approx(12 * shape.n_params + max(turns[seq_len], step))
    assert turns[256] < 8 * shape.n_params < turns[4096]


def test_nvme_bytes_per_step_follow_what_zero_infinity_swaps():
    shape = _shape("gpt-1.4b", grad_accum=2)
    n = shape.n_params
    swappable_grads = sum(4 * numel for numel in shape.param_numels if 4 * numel >= 1 << 20)
    on_disk = step_bytes(_zero("z3nn", 3, "nvme", "nvme", max_in_cpu=0), shape, world=1)
    # Parameters (bf16) read for forward and backward of each micro-batch, less the 1e9 (stage3_max_reuse_distance)
    # kept across the forward/backward turn, and written once; the optimizer's fp32 master, m, v and the
    # gradients big enough for aio (LayerNorms and biases stay in RAM) each way.
    assert on_disk["nvme_read"] == pytest.approx(2 * 2 * (2 * n - 1e9) + 12 * n + swappable_grads)
    assert on_disk["nvme_write"] == pytest.approx(2 * n + 12 * n + swappable_grads)
    # DeepSpeed's default max_in_cpu (1e9 elements) keeps a sub-group in RAM only if it fits whole, and its
    # sub-groups fill to at least sub_group_size (1e9): this model's first holds more than 1e9, so every
    # parameter is on NVMe with the default too (an H200 run wrote 25.50 GB a step, as predicted here).
    first, second = sub_groups(shape, world=1)
    assert first >= 1e9 and first + second == n
    assert step_bytes(_zero("z3nn", 3, "nvme", "nvme"), shape, world=1) == on_disk
    # Room for the first sub-group keeps it in RAM; only the second travels.
    roomy = step_bytes(_zero("z3nn", 3, "nvme", "nvme", max_in_cpu=first), shape, world=1)
    assert roomy["nvme_read"] == pytest.approx(2 * 2 * (2 * second - min(second, 1e9)) + 12 * n + swappable_grads)
    assert roomy["nvme_write"] == pytest.approx(2 * second + 12 * n + swappable_grads)


def test_a_partial_optimizer_offload_is_offered_when_part_of_it_fits():
    """At 40 GiB one of the 1.42B model's two sub-groups fits beside the rest (at 24 GiB none does, and the
    row offered there was zero3-opt-cpu under another name)."""
    shape = _shape("gpt-1.4b")
    predictions = {}
    for gib in (24, 40):
        machine = Machine(gpus=1, gpu_mem_bytes=gib * GiB, host_mem_bytes=128 * GiB, nvme_free_bytes=None)
        predictions[gib] = {x.placement.name: x for x in plan(shape, machine, LINKS)}
    assert not [n for n in predictions[24] if n.startswith("zero3-opt-cpu-ratio")]
    (partial,) = [x for n, x in predictions[40].items() if n.startswith("zero3-opt-cpu-ratio")]
    assert 0 < partial.placement.strategy.ratio < 1 and partial.fits
    assert partial.memory.host_bytes < predictions[40]["zero3-opt-cpu"].memory.host_bytes


def test_a_partial_optimizer_offload_rescues_a_placement_host_ram_cannot_hold():
    """A GPU with room to spare keeps part of the optimizer where host RAM is too small for all of it."""
    shape = _shape("gpt-1.4b")
    machine = Machine(gpus=1, gpu_mem_bytes=80 * GiB, host_mem_bytes=20 * GiB, nvme_free_bytes=None)
    predictions = {x.placement.name: x for x in plan(shape, machine, LINKS)}
    whole = predictions["zero3-opt-cpu"]
    assert not whole.fits and whole.binding.startswith("host RAM")
    (partial,) = [x for name, x in predictions.items() if name.startswith("zero3-opt-cpu-ratio")]
    assert partial.fits and partial.memory.host_bytes < 20 * GiB < whole.memory.host_bytes


@pytest.mark.parametrize("world", [1, 2, 8])
def test_what_the_plan_calls_pinned_is_the_buffers_the_engines_pin(world):
    """`plan --json`'s pinned_bytes and the breakdown's "host pinned" are the buffers each engine pins (the
    list the pinned rounding is taken over). DeepSpeed's offloaded optimizer states were all counted
    pinned, 16 bytes a parameter, where the engine pins 4 (ZeRO-3's fp32 gradient) or 8 (ZeRO-1/2's fp32
    partition and its gradient): Adam's m and v are CPU Adam's own pageable state."""
    shape = _shape("gpt-1.4b")
    buffers = buffers_for(shape)
    offloading = [p for p in candidate_placements() if p.strategy.offloads]
    pageable = [
        p.varied(f"{p.name}-pageable", pin_memory=False) for p in offloading if hasattr(p.strategy, "pin_memory")
    ]
    for p in offloading + pageable:  # (torchao pins its buffers always)
        engine = engine_for(p.strategy).planner
        m = engine.memory(p, shape, world, buffers, True)
        listed = sum(engine.pinned_buffers(p, shape, world, buffers))
        assert m.pinned_bytes == pytest.approx(listed, rel=1e-6), p.name
    zero3 = deepspeed.model_states(_zero("z3c", 3, "cpu"), shape, world)
    assert zero3.host_pinned["optimizer states"] == pytest.approx(4 * shape.n_params / world)
    assert zero3.host_pageable["optimizer states"] == pytest.approx(12 * shape.n_params / world)


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_master_weights_halve_the_offloaded_optimizer_and_zero2s_gradient_traffic(stage):
    """bf16_master_weights_and_grads with bf16_optimizer_states: master, gradient, m and v in bf16 on the
    host, 8 bytes a parameter instead of 16; ZeRO-1/2 send bf16 gradients down, not fp32 ones."""
    shape, world = _shape("gpt-1.4b"), 2
    fp32, bf16 = (_zero(f"z{stage}c", stage, "cpu", bf16_master_weights=on) for on in (False, True))
    states = {}
    for p in (fp32, bf16):
        m = deepspeed.model_states(p, shape, world)
        states[p.strategy.bf16_master_weights] = (
            m.host_pinned["optimizer states"] + m.host_pageable["optimizer states"],
            m.host_pinned["optimizer states"],
        )
        pinned = deepspeed.memory(p, shape, world, None, True).pinned_bytes
        assert pinned == pytest.approx(sum(deepspeed.pinned_buffers(p, shape, world, None)))
    assert states[False][0] == pytest.approx(16 * shape.n_params / world)
    assert states[True][0] == pytest.approx(8 * shape.n_params / world)
    assert states[True][1] == pytest.approx(states[False][1] / 2)
    down = {p.strategy.bf16_master_weights: step_bytes(p, shape, world)["pcie_d2h"] for p in (fp32, bf16)}
    assert down[True] == pytest.approx(down[False] / (2 if stage == 2 else 1))


@pytest.mark.parametrize("world", [1, 8])
def test_without_pin_memory_only_the_buffers_deepspeed_always_pins_stay_pinned(world):
    """pin_memory = false leaves the optimizer's buffers pageable (stage_1_and_2, stage3 check it), but
    not stage3's flat buffer of the offloaded parameters nor the NVMe swap buffers: the host's total is
    the same, its pinned part what the engine really pins."""
    shape = _shape("gpt-1.4b")
    buffers = buffers_for(shape)
    for p in (_zero("z2c", 2, "cpu"), _zero("z3c", 3, "cpu"), _zero("z3cc", 3, "cpu", "cpu")):
        pageable = p.varied(p.name, pin_memory=False)
        pinned, unpinned = (deepspeed.memory(x, shape, world, buffers, True) for x in (p, pageable))
        assert unpinned.host_bytes == pytest.approx(pinned.host_bytes) and pinned.pinned_bytes > 0
        flat_params = shape.param_bytes * shape.n_params / world if p.strategy.offload_param == "cpu" else 0
        assert unpinned.pinned_bytes == pytest.approx(flat_params), p.name
    # ZeRO-Infinity: the parameters kept in RAM and both swappers' buffers stay pinned; the 16-bit gradient
    # partitions (stage3's grad_partitions_flat_buffer) follow the flag.
    nvme = _zero("z3nn", 3, "nvme", "nvme")
    always = deepspeed.pinned_buffers(nvme.varied("pageable", pin_memory=False), shape, world, buffers)
    gradients = shape.param_bytes * math.ceil(shape.n_params / world)
    assert sorted(always + [gradients]) == sorted(deepspeed.pinned_buffers(nvme, shape, world, buffers))
    assert len(always) == 1 + buffers.param_buffer_count + buffers.optimizer_buffer_count


def test_a_partial_offload_moves_whole_sub_groups_and_the_gpu_updates_its_share_in_the_same_loop():
    """stage3 sends sub-group i to the CPU when i >= int((1 - ratio) * count); torch's AdamW updates the
    rest on the GPU, one sub-group after another with the CPU's."""
    shape = _shape("gpt-1.4b")
    first, second = sub_groups(shape, world=1)
    partial = _zero("zero3-opt-cpu-ratio0.3", 3, "cpu", ratio=0.3)
    memory = deepspeed.model_states(partial, shape, world=1)
    on_host = memory.host_pinned["optimizer states"] + memory.host_pageable["optimizer states"]
    assert on_host == pytest.approx(16 * second)  # the second sub-group, 0.42B of 1.42B
    # Pinned of it: the fp32 gradient, one of DeepSpeed's pinned buffers (Adam's m and v, and ZeRO-3's fp32
    # partition, are pageable).
    assert memory.host_pinned["optimizer states"] == pytest.approx(4 * second)
    assert 4 * second in deepspeed.pinned_buffers(partial, shape, 1, None)
    assert memory.gpu["optimizer states"] == pytest.approx(16 * first)
    bound = predict_step(partial, shape, 1, LINKS)
    assert bound.parts["cpu_adam"] == pytest.approx(second / LINKS.cpu_adam_params_per_s)
    assert bound.parts["device_adam"] == pytest.approx(first / LINKS.device_adam_params_per_s)
    full = predict_step(partial.varied(partial.name, ratio=1.0), shape, 1, LINKS)
    assert "device_adam" not in full.parts and full.parts["cpu_adam"] > bound.parts["cpu_adam"]


def test_zero3_ratios_are_offered_only_where_they_keep_part_of_the_optimizer_on_the_gpu():
    """DeepSpeed moves whole sub-groups: a model of one keeps none of it on the GPU at any ratio, and a
    helper found zero3-opt-cpu-ratio0.1 planned byte for byte as zero3-opt-cpu at 125M."""
    offload = Placement(DeepSpeedStrategy(name="z", engine="deepspeed", zero_stage=3, offload_optimizer="cpu"))
    placements = engine_for(offload.strategy).placements
    assert placements.partial_offloads(offload, _shape("gpt-125m"), 1, 80 * GiB) == []
    shape = _shape("gpt-1.4b")  # two sub-groups (1e9 elements and the rest): up to ratio 0.5 keeps the first
    offered = placements.partial_offloads(offload, shape, 1, 80 * GiB)
    assert [r.strategy.ratio for r in offered] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert [deepspeed.host_optimizer_share(r, shape, 1) for r in offered] == [pytest.approx(0.286, abs=1e-3)] * 5


def test_fsdp2_offload_keeps_its_blocks_gathered_where_the_gpu_has_room_for_the_whole_model():
    """reshard_after_forward=False uploads each fp32 shard once a step, not twice a micro-batch (an H100 ran a
    1.42B GPT's step in 1.223 s against 1.295), and holds every block gathered from its forward to its
    backward."""
    shape = _shape("gpt-1.4b")
    offload = Placement(FSDP2Strategy(name="o", engine="fsdp2", cpu_offload=True, cpu_optimizer="deepspeed"))
    (kept,) = engine_for(offload.strategy).placements.partial_offloads(offload, shape, 1, 40 * GiB)
    assert kept.name == "o-kept" and not kept.strategy.reshard_after_forward
    assert step_bytes(kept, shape, 1)["pcie_h2d"] == step_bytes(offload, shape, 1)["pcie_h2d"] / 2
    # With accumulation the blocks also stay gathered from one micro-batch to the next: still one upload.
    accumulating = dataclasses.replace(shape, grad_accum=4)
    assert step_bytes(kept, accumulating, 1)["pcie_h2d"] == step_bytes(kept, shape, 1)["pcie_h2d"]
    assert step_bytes(offload, accumulating, 1)["pcie_h2d"] == 4 * step_bytes(offload, shape, 1)["pcie_h2d"]
    turn = {x.name: fsdp2.memory(x, shape, 1, None, True).gpu_turn for x in (offload, kept)}
    assert turn["o-kept"]["gathered model"] == shape.param_bytes * shape.n_params
    assert "gathered model" not in turn["o"]
    assert not engine_for(kept.strategy).placements.partial_offloads(kept, shape, 1, 40 * GiB)
    # The plan offers it beside the placement it varies only where the GPU holds the gathered model.
    roomy, tight = (Machine(1, gib * GiB, 512 * GiB, 1e13) for gib in (80, 10))
    names = {machine: {x.placement.name for x in plan(shape, machine, LINKS) if x.fits} for machine in (roomy, tight)}
    assert "fsdp2-cpu-offload-dsadam-kept" in names[roomy]
    assert "fsdp2-cpu-offload-dsadam" in names[tight] and "fsdp2-cpu-offload-dsadam-kept" not in names[tight]


def test_a_written_placement_swapping_parameters_has_the_buffers_deepspeed_needs(tmp_path):
    """DeepSpeed's default 5 buffers of 1e8 elements stop a 1.42B GPT: its embedding (103M elements) fits
    none, and at the default 1e9 reuse window the forward/backward turn holds 33 parameters (an H200 run
    with 16 stopped at step 2, bench/results/2026-12-05-h200-s19). `plan --write` wrote neither, so `run`
    refused the spec it wrote; it now writes the buffers the plan counted, and `run`'s checks pass them."""
    from offloadlab.checks.host import PreflightError
    from offloadlab.plan.output import run_spec_for
    from offloadlab.run.preflight import check_buffer_fits_largest_param, check_buffers_hold_the_turn

    model = dict(preset="gpt-1.4b")
    batch = dict(seq_len=1024, micro_batch=4, grad_accum=1, precision="bf16")
    spec = load_spec(write_spec(tmp_path, [dict(name="any", engine="fsdp2")], model=model, **batch))
    shape, machine = shape_of_spec(spec), Machine(1, 80 * GiB, 512 * GiB, 1e13)
    buffers = buffers_for(shape)
    placement = next(p for p in candidate_placements() if p.name == "zero3-opt-nvme-param-nvme")
    raw = run_spec_for(spec, predict(placement, shape, machine, LINKS, buffers), None, buffers)
    (tmp_path / "written.toml").write_text(tomli_w.dumps(raw | {"nvme_path": str(tmp_path)}))
    written = load_spec(tmp_path / "written.toml")
    (strategy,) = written.strategy
    assert (strategy.buffer_count, strategy.buffer_size) == (33, shape.largest_param_numel)
    check_buffer_fits_largest_param(strategy, shape.largest_param_numel)
    check_buffers_hold_the_turn(written, strategy, shape)
    with pytest.raises(PreflightError, match="buffer_count = 32 is too few"):
        check_buffers_hold_the_turn(written, strategy.model_copy(update={"buffer_count": 32}), shape)
    # A tune that sized the buffers keeps its own; one that only chose aio settings does not.
    planned = predict(placement, shape, machine, LINKS, buffers)
    for fragment, written_count in (("[swap_buffers]\nbuffer_count = 40\n", 40), ("[aio]\nqueue_depth = 16\n", 33)):
        (tmp_path / "tuned.toml").write_text(fragment)
        raw = run_spec_for(spec, planned, tmp_path / "tuned.toml", buffers) | {"nvme_path": str(tmp_path)}
        (tmp_path / "written.toml").write_text(tomli_w.dumps(raw))
        assert load_spec(tmp_path / "written.toml").strategy[0].buffer_count == written_count
    # The plan's pinned RAM holds the same buffers.
    swap = swap_buffer_bytes(placement, shape, 1, buffers)["parameter swap buffers"]
    assert swap == [shape.largest_param_numel * 2] * 33


@pytest.mark.slow
def test_plan_writes_a_spec_offloadlab_runs_and_configs_deepspeed_and_accelerate_read(tmp_path):
    spec = write_spec(tmp_path, [dict(name="any", engine="fsdp2")], nvme_path=str(tmp_path))
    out = tmp_path / "planned"
    proc = cli("plan", str(spec), "--gpu-mem", "0", "--strategy", "zero3-opt-nvme-param-nvme", "--write", str(out))
    assert "wins: it fits" in proc.stdout
    written = sorted(p.name for p in out.iterdir())
    assert written == [
        "zero3-opt-nvme-param-nvme.toml",
        "zero3-opt-nvme-param-nvme_accelerate.yaml",
        "zero3-opt-nvme-param-nvme_accelerate_deepspeed.json",
        "zero3-opt-nvme-param-nvme_deepspeed.json",
    ]
    planned = load_spec(out / "zero3-opt-nvme-param-nvme.toml")
    (strategy,) = planned.strategy
    assert (strategy.zero_stage, strategy.offload_optimizer, strategy.offload_param) == (3, "nvme", "nvme")
    config = json.loads((out / "zero3-opt-nvme-param-nvme_deepspeed.json").read_text())
    zero = DeepSpeedZeroConfig(**config["zero_optimization"])
    assert zero.offload_param.device == "nvme" and zero.offload_optimizer.device == "nvme"
    assert get_aio_config(config)["intra_op_parallelism"] == config["aio"]["intra_op_parallelism"]
    accelerate = yaml.safe_load((out / "zero3-opt-nvme-param-nvme_accelerate.yaml").read_text())
    assert accelerate["distributed_type"] == "DEEPSPEED"
    assert (
        Path(accelerate["deepspeed_config"]["deepspeed_config_file"])
        == (out / "zero3-opt-nvme-param-nvme_accelerate_deepspeed.json").resolve()
    )
    # The written spec trains for real.
    run = cli("run", str(out / "zero3-opt-nvme-param-nvme.toml"), "--out", str(tmp_path / "run"))
    assert "verified" in run.stdout


@pytest.mark.slow
def test_plan_without_spec_or_model_names_the_fix():
    proc = cli("plan", check=False)
    assert proc.returncode == 2 and "plan needs a SPEC or --model PRESET" in proc.stderr


@pytest.mark.slow
def test_plan_json_lists_every_placement(tmp_path):
    proc = cli(
        "plan",
        "--model",
        "gpt-125m",
        "--gpus",
        "1",
        "--gpu-mem",
        "80",
        "--host-mem",
        "64",
        "--nvme",
        str(tmp_path),
        "--json",
    )
    result = json.loads(proc.stdout)
    names = {p["strategy"] for p in result["predictions"]}
    assert {"zero1", "zero2-cpu", "zero3-opt-nvme-param-nvme", "fsdp2", "fsdp2-cpu-offload"} <= names
    assert all(p["step_s"] > 0 for p in result["predictions"] if p["fits"])
    assert list(tmp_path.iterdir()) == []  # the quick NVMe measurement removed its files
    # An 80 GiB GPU planned from a machine without one: this CPU's Adam rate is no measure of its step.
    assert result["links"]["device_adam_params_per_s"] is None
    assert result["links"]["cpu_adam_params_per_s"] > 0


@pytest.mark.slow
def test_on_a_cpu_only_machine_the_device_adam_is_the_cpus_own(tmp_path):
    proc = cli("plan", "--model", "gpt-125m", "--gpus", "1", "--gpu-mem", "0", "--host-mem", "64", "--json")
    links = json.loads(proc.stdout)["links"]
    assert links["device_adam_params_per_s"] == links["torch_cpu_adam_params_per_s"] > 0
    assert links["device_fused_adam_params_per_s"] > 0


@pytest.mark.slow
def test_predicted_nvme_bytes_per_step_hold_on_a_real_zero_infinity_run(tmp_path, nvme_root):
    """bench/plan_accuracy at CI size: the swap traffic of a real ZeRO-3 NVMe run within the goal's 5%."""
    strategies = [
        dict(
            name="z3-nvme",
            engine="deepspeed",
            zero_stage=3,
            offload_optimizer="nvme",
            offload_param="nvme",
            buffer_size=2_000_000,
            buffer_count=8,
        ),
        dict(
            name="z3-nvme-4m-blocks",
            engine="deepspeed",
            zero_stage=3,
            offload_optimizer="nvme",
            offload_param="nvme",
            buffer_size=2_000_000,
            buffer_count=8,
            aio=dict(block_size=4 << 20),
        ),
    ]
    spec = write_spec(
        tmp_path,
        strategies,
        nvme_path=str(nvme_root),
        model=dict(preset="small-cpu"),
        seq_len=64,
        steps=4,
        verify_checkpoint=False,
    )
    cli("run", str(spec), "--out", str(tmp_path / "run"))
    rows = {r["strategy"]: r for r in load_bench("plan_accuracy").compare(spec, tmp_path / "run", Console(quiet=True))}
    for row in rows.values():
        for key in ("nvme_read", "nvme_write"):
            assert row[f"{key}_measured"] == pytest.approx(row[f"{key}_predicted"], rel=0.05), (row["strategy"], key)
    # A 4 MiB aio block leaves the 1 MiB gradients in RAM: less traffic, and the planner knows it.
    assert rows["z3-nvme-4m-blocks"]["nvme_read_predicted"] < rows["z3-nvme"]["nvme_read_predicted"]
    # The step by phase: the run's phase timings beside the parts of the bound that fall in each.
    for row in rows.values():
        assert row["training_measured"] > 0 and row["optimizer_measured"] > 0
        assert row["training_predicted"] + row["optimizer_predicted"] == pytest.approx(row["mean_step_predicted"])
        assert row["optimizer_predicted"] > 0  # the NVMe swap of the optimizer states follows backward
        # The drive's time the plan counts, and the part of it the run's steps waited for.
        assert row["nvme_predicted"] > 0
        assert 0 < row["nvme_measured"] < row["training_measured"] + row["optimizer_measured"]


def test_plan_strategy_is_for_write_and_a_wrong_name_lists_the_placements(tmp_path):
    proc = cli("plan", "--model", "tiny", "--strategy", "zero1", check=False)
    assert proc.returncode == 2 and "add --write DIR to write zero1" in flat(proc.stdout + proc.stderr)


@pytest.mark.slow
def test_plan_write_refuses_a_placement_it_did_not_plan_and_a_plan_where_nothing_fits(tmp_path):
    out = tmp_path / "out"
    base = ("plan", "--model", "tiny", "--gpu-mem", "0", "--write", str(out))
    proc = cli(*base, "--strategy", "no-such", check=False)
    message = flat(proc.stdout + proc.stderr)
    assert proc.returncode == 2 and "'no-such' is not one of the planned placements: " in message
    assert "zero3-opt-cpu" in message.split("planned placements: ")[1]
    proc = cli(*base, "--host-mem", "0.01", check=False)
    assert proc.returncode == 2 and "nothing fits: nothing to write" in flat(proc.stdout + proc.stderr)
    assert not out.exists()


@pytest.mark.slow
def test_plan_largest_finds_the_biggest_gpt_that_fits_and_one_more_layer_does_not(tmp_path):
    from offloadlab.workload.model import GPTConfig

    proc = cli(
        "plan",
        "--largest",
        "--gpus",
        "1",
        "--gpu-mem",
        "24",
        "--host-mem",
        "64",
        "--nvme",
        str(tmp_path),
        "--tflops",
        "100",
        "--pcie",
        "25",
        "--json",
    )
    result = json.loads(proc.stdout)
    shape, machine, links = result["shape"], Machine(**result["machine"]), Links(**result["links"])
    assert any(p["fits"] for p in result["predictions"])

    def fits(n_layers: int) -> bool:
        cfg = GPTConfig(d_model=shape["d_model"], n_layers=n_layers, n_heads=8, vocab_size=shape["vocab_size"])
        s = Shape.of(cfg, shape["seq_len"], shape["micro_batch"], shape["grad_accum"], "bf16")
        return any(x.fits for x in plan(s, machine, links, buffers_for(s)))

    assert fits(shape["n_layers"]) and not fits(shape["n_layers"] + 1)
    # The plan says so itself: one more layer, with each placement's reason (each candidate's: a variant
    # offered where its placement leaves the GPU room, such as FSDP2's -kept, is not offered past it; the
    # largest model, and so which variants fit at it, follows the free space of the --nvme folder).
    past = result["one_more_layer"]
    assert past["shape"]["n_layers"] == shape["n_layers"] + 1 and past["shape"]["d_model"] == shape["d_model"]
    candidates = {p.name for p in candidate_placements()}
    assert (
        not past["fits"]
        and set(past["bindings"]) >= {p["strategy"].removesuffix("+ac") for p in result["predictions"]} & candidates
    )
    assert sum(shape["param_numels"]) > 1e9  # 24 GiB of GPU and 64 GiB of RAM train more than the 760M preset


H200_STORES = {
    "2026-12-02-h200-s3/zero3-nvme-1.4b": ["zero3-nvme"],
    "2026-12-02-h200-s4/at_scale-1.4b": ["zero3-nvme-tuned", "zero3-cpu", "zero2-cpu", "fsdp2-cpu-offload"],
    "2026-12-03-h200-s5/at_scale-fsdp2": ["fsdp2"],
    "2026-12-03-h200-s6/at_scale-ram/run": ["zero3-cpu", "zero2-cpu", "fsdp2-cpu-offload", "fsdp2"],
    "2026-12-03-h200-s6/at_scale-nvme/run": ["zero3-nvme", "zero3-nvme-tuned"],
}


@pytest.mark.parametrize("store", H200_STORES)
def test_predictions_hold_for_what_an_h200_measured_at_1_4b(store):
    """Issue 6's goals against the committed H200 runs of configs/gpt1.4b_h200.toml: peak GPU allocated
    within 10%, NVMe bytes per step within 5%. (A `-tuned` twin differs from its strategy only in aio.)"""
    from offloadlab.plan.predict import predict_memory
    from offloadlab.results.store import RunStore
    from offloadlab.results.summary import summarize
    from offloadlab.workload.model import gpt_config

    spec = load_spec(Path("configs/gpt1.4b_h200.toml"))
    shape = Shape.of(
        gpt_config(spec.model, spec.seq_len), spec.seq_len, spec.micro_batch, spec.grad_accum, spec.precision
    )
    measured = {s.name: s for s in summarize(RunStore(Path("bench/results") / store))}
    assert set(H200_STORES[store]) <= set(measured)
    for name in H200_STORES[store]:
        placement = Placement(spec.get_strategy(name.removesuffix("-tuned")), spec.model.activation_checkpointing)
        run = measured[name]
        assert run.peak_allocated_bytes == pytest.approx(predict_memory(placement, shape, 1).gpu_bytes, rel=0.10), name
        moved = step_bytes(placement, shape, 1)
        assert (run.disk_read_bytes_per_step or 0) == pytest.approx(moved["nvme_read"], rel=0.05, abs=1 << 20), name
        assert (run.disk_write_bytes_per_step or 0) == pytest.approx(moved["nvme_write"], rel=0.05, abs=1 << 20), name


# Host RSS peaks the planner accounts for (the process tree's, all runs on H200s with torch 2.11, whose pinned
# allocator rounds each buffer up to a power of two: what DeepSpeed still exceeds the plan by).
H200_HOST_RSS = {
    "2026-12-03-h200-s6/at_scale-ram/run": {"fsdp2": 0.02, "fsdp2-cpu-offload": 0.10, "zero3-cpu": 0.25},
    "2026-12-02-h200-s4/largest": {"zero3-opt-cpu-ratio0.3": 0.20},  # 8.07B
}


@pytest.mark.parametrize("store", H200_HOST_RSS)
def test_host_rss_holds_for_the_cuda_runtime_and_zero3s_pinned_gradient_buffer(store):
    """The CUDA runtime's resident bytes and ZeRO-3's 16-bit gradient buffer on the CPU were missing: the
    prediction ran 1.15x low for FSDP2 without offload and 1.60x low for the 8.07B partial offload."""
    from offloadlab.engines.deepspeed.buffers import swap_buffers_of
    from offloadlab.plan.predict import predict_memory
    from offloadlab.results.store import RunStore
    from offloadlab.results.summary import summarize
    from offloadlab.spec import parse_spec

    run = RunStore(Path("bench/results") / store)
    spec = parse_spec(tomllib.loads(run.run()["spec_toml"]))
    shape = shape_of_spec(spec)
    measured = {s.name: s.host_rss_peak_bytes for s in summarize(run)}
    for name, above in H200_HOST_RSS[store].items():
        strategy = spec.get_strategy(name)
        placement = Placement(strategy, spec.model.activation_checkpointing)
        predicted = predict_memory(placement, shape, 1, swap_buffers_of(strategy, shape)).host_bytes
        assert predicted <= measured[name] <= (1 + above) * predicted, name


# H200 runs on torch 2.11, whose pinned allocator rounds each pinned buffer up to a power of two: the host
# RSS each CPU-offload strategy reached, and how far above the prediction for that allocator it may be.
H200_PINNED_ROUNDED = {
    ("2026-12-03-h200-s10/run_a.tar.gz", "run_a"): {"zero2-cpu": 0.02, "fsdp2-cpu-dsadam": 0.01},
    ("2026-12-03-h200-s10/run_b.tar.gz", "run_b"): {
        "fsdp2-cpu-offload": 0.03,
        "zero3-cpu": 0.11,
        "zero3-opt-cpu": 0.09,
    },
    # The 24 GiB grid's runs of the largest GPT: torch's AdamW and DeepSpeed's CPU Adam, 35 and 36 layers
    **{
        ("2026-12-04-h200-s16/grid_24/grid_24.tar.gz", f"grid_24/{layers}-{name}"): {name: 0.005}
        for layers in (35, 36)
        for name in ("fsdp2-cpu-offload", "fsdp2-cpu-offload-dsadam")
    },
}


@pytest.mark.parametrize("tarball", H200_PINNED_ROUNDED)
def test_host_rss_holds_with_each_pinned_buffer_rounded_as_torch_2_11_does(tmp_path, tarball):
    """ZeRO-1/2's host RSS ran 1.43x low at 1.42B (22.7 GiB predicted, 32.4 measured): the planner left out
    their pinned 16-bit copy of the partition, and the H200's torch 2.11 rounds every pinned buffer up to a
    power of two (the fp32 partition and its gradient 5.28 -> 8 GiB each, the copy 2.64 -> 4). With both,
    ZeRO-2 and FSDP2 hold to 2-3%; ZeRO-3 stays up to 11% above (not found yet). At 7.5-7.7B FSDP2 holds
    to 0.5% with torch's AdamW (two temporaries of the largest tensor) and DeepSpeed's CPU Adam (none)."""
    import tarfile

    from offloadlab.plan.predict import predict_memory
    from offloadlab.results.store import RunStore
    from offloadlab.results.summary import summarize
    from offloadlab.spec import parse_spec

    path, folder = tarball
    with tarfile.open(Path("bench/results") / path) as tar:
        tar.extractall(tmp_path, filter="data")
    run = RunStore(tmp_path / folder)
    spec = parse_spec(tomllib.loads(run.run()["spec_toml"]))
    shape = shape_of_spec(spec)
    measured = {s.name: s.host_rss_peak_bytes for s in summarize(run)}
    for name, above in H200_PINNED_ROUNDED[tarball].items():
        placement = Placement(spec.get_strategy(name), spec.model.activation_checkpointing)
        exact = predict_memory(placement, shape, 1, pinned_exact=True)
        rounded = predict_memory(placement, shape, 1, pinned_exact=False)
        assert exact.host_bytes < rounded.host_bytes
        assert 0.98 * rounded.host_bytes <= measured[name] <= (1 + above) * rounded.host_bytes, name
    copy = predict_memory(Placement(spec.get_strategy("zero2-cpu")), shape, 1) if folder == "run_a" else None
    assert copy is None or copy.host_pinned["16-bit copy of the partition"] == 2 * shape.n_params


def test_fsdp2_with_deepspeeds_cpu_adam_is_weighed_at_its_rate_and_a_specs_zenflow_alongside():
    shape = _shape("gpt-1.4b")
    machine = Machine(gpus=1, gpu_mem_bytes=20 * GiB, host_mem_bytes=120 * GiB, nvme_free_bytes=None)
    zenflow = Placement(
        DeepSpeedStrategy(name="zf", engine="deepspeed", zero_stage=2, offload_optimizer="cpu", zenflow={})
    )
    predictions = {x.placement.name: x for x in plan(shape, machine, LINKS, also=(zenflow,))}
    torch_adam, ds_adam = predictions["fsdp2-cpu-offload"], predictions["fsdp2-cpu-offload-dsadam"]
    assert ds_adam.memory.gpu_bytes == torch_adam.memory.gpu_bytes
    optimizer = lambda x: x.step.parts["cpu_adam"]  # noqa: E731
    n = shape.n_params
    slower = fsdp2.FSDP2_CPU_STEP_OVER_PROBES
    assert optimizer(torch_adam) - optimizer(ds_adam) == pytest.approx(
        slower["torch"] * n / 2e8 - slower["deepspeed"] * n / 1e9, rel=1e-6
    )
    # ZenFlow keeps its selective AdamW's 16-bit moments for the top 10% of columns on the GPU.
    zero2 = predictions["zero2-cpu"]
    assert predictions["zf"].memory.gpu_bytes - zero2.memory.gpu_bytes == pytest.approx(4 * 0.1 * n)


@pytest.mark.parametrize("param", ["none", "cpu"])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_zero3_waits_on_its_hooks_for_every_parameter_tensor_each_micro_batch(param, grad_accum):
    """Host time in forward and backward that no link overlaps: ZeRO-3's fetch/release and gradient hooks
    (ZeRO-3 over ZeRO-2 at 1.42B on the H200 hosts: 0.13-0.16 s a micro-batch), wherever its parameters live."""
    shape = _shape("gpt-1.4b", grad_accum=grad_accum)
    bound = predict_step(_zero("z3", 3, "cpu", param), shape, 1, LINKS)
    hooks = grad_accum * len(shape.param_numels) * deepspeed.ZERO3_HOOK_S_PER_TENSOR
    assert bound.parts["zero3_hooks"] == pytest.approx(hooks)
    assert 0.1 * grad_accum < hooks < 0.2 * grad_accum
    overlapped = max(bound.parts[k] for k in ("compute", "pcie_h2d", "pcie_d2h"))
    assert bound.training_s == pytest.approx(overlapped + bound.parts["grad_handoff"] + hooks)
    zero2 = predict_step(_zero("z2", 2, "cpu"), shape, 1, LINKS)
    assert "zero3_hooks" not in zero2.parts


def test_zero3_uploads_parameters_it_keeps_on_the_gpu_at_the_converting_rate_where_one_was_measured():
    """stage3 copies the pageable fp32 partition into the GPU's 16-bit one (a converting copy from pageable
    memory: 2.06x the optimizer phase's bound at 1.42B on an H200); ZeRO-2 casts into a pinned buffer."""
    shape = _shape("gpt-1.4b")
    n = shape.n_params

    def upload_s(links: Links, **settings) -> float | None:
        strategy = DeepSpeedStrategy(name="s", engine="deepspeed", offload_optimizer="cpu", **settings)
        return predict_step(Placement(strategy), shape, 1, links).parts.get("param_upload")

    measured = dataclasses.replace(LINKS, converting_upload_params_per_s=5e8)
    assert upload_s(measured, zero_stage=3) == pytest.approx(n / 5e8)
    assert upload_s(LINKS, zero_stage=3) == pytest.approx(2 * n / LINKS.pcie_h2d)  # not measured: pinned
    assert upload_s(measured, zero_stage=2) == upload_s(LINKS, zero_stage=2) == pytest.approx(2 * n / LINKS.pcie_h2d)
    half = Placement(DeepSpeedStrategy(name="s", engine="deepspeed", offload_optimizer="cpu", zero_stage=3, ratio=0.5))
    share = deepspeed.host_optimizer_share(half, shape, 1)  # whole sub-groups: 0.29 here
    assert 0 < share < 1
    assert upload_s(measured, zero_stage=3, ratio=0.5) == pytest.approx(share * n / 5e8)  # the host's share
    assert upload_s(measured, zero_stage=3, offload_param="cpu") is None  # parameters fetched in forward instead


@pytest.mark.parametrize("overlap_step", [True, False])
def test_zenflow_carries_a_quarter_of_the_cpu_update_a_step_and_overlaps_it_with_training(overlap_step):
    shape, n = _shape("gpt-1.4b"), _shape("gpt-1.4b").n_params
    settings = dict(topk_ratio=0.1, select_strategy="step", select_interval=4, update_interval=4)
    zenflow = Placement(
        DeepSpeedStrategy(
            name="zf",
            engine="deepspeed",
            zero_stage=2,
            offload_optimizer="cpu",
            zenflow={**settings, "overlap_step": overlap_step},
        )
    )
    zero2 = Placement(DeepSpeedStrategy(name="z2c", engine="deepspeed", zero_stage=2, offload_optimizer="cpu"))
    bound, plain = predict_step(zenflow, shape, 1, LINKS), predict_step(zero2, shape, 1, LINKS)
    cpu_update = 0.9 * n / LINKS.cpu_adam_params_per_s / 4 + 0.9 * n / LINKS.host_passes_params_per_s / 4
    assert bound.parts["cpu_adam"] + bound.parts["host_passes"] == pytest.approx(cpu_update)
    assert bound.parts["device_adam"] == pytest.approx(0.1 * n / LINKS.device_adam_params_per_s)  # every step
    training = max(plain.parts[k] for k in ("compute", "pcie_h2d", "pcie_d2h"))
    after_backward = bound.parts["device_adam"] + bound.parts["param_upload"]
    handoff = bound.parts["grad_handoff"]  # every gradient still goes to the host in backward
    assert handoff == pytest.approx(plain.parts["grad_handoff"])
    if overlap_step:  # the CPU's update runs beside the next steps' forward and backward
        assert bound.training_s == pytest.approx(max(training, cpu_update) + handoff)
        assert bound.optimizer_s == pytest.approx(after_backward)
    else:
        assert bound.training_s == pytest.approx(training + handoff)
        assert bound.optimizer_s == pytest.approx(cpu_update + after_backward)
    assert bound.seconds < plain.seconds


# Session 15's H200 runs on one machine, each beside `offloadlab plan --json` made there (its machine, budget
# and links): the six 1.42B strategies (12 steps; zero3-opt-cpu stopped by the call's time limit after 6)
# and `plan --largest --gpu-mem 24`'s pick, a 7.67B GPT trained 14 steps under that budget.
H200_STEPS = {
    ("calibrate", "calibrate.tar.gz", "plan.json"): [
        "fsdp2",
        "zero2-cpu",
        "fsdp2-cpu-dsadam",
        "fsdp2-cpu-offload",
        "zero3-cpu",
        "zero3-opt-cpu",
    ],
    ("budget_24", "run_24_1.tar.gz", "plan_24.json"): ["fsdp2-cpu-offload-dsadam"],
}


@pytest.mark.parametrize("case", H200_STEPS)
def test_the_predicted_step_holds_within_20_percent_of_the_h200_runs(tmp_path, case):
    """Issue 21: the step predicted, not only bounded, within +-20% of the measured mean steady step."""
    import tarfile

    from offloadlab.results.store import RunStore
    from offloadlab.results.summary import summarize
    from offloadlab.spec import parse_spec

    folder, tarball, plan_json = case
    results = Path("bench/results/2026-12-04-h200-s15") / folder
    with tarfile.open(results / tarball) as tar:
        tar.extractall(tmp_path, filter="data")
    (store_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = RunStore(store_dir)
    spec = parse_spec(tomllib.loads(run.run()["spec_toml"]))
    planned = json.loads((results / plan_json).read_text())
    machine, links = Machine(**planned["machine"]), Links(**planned["links"])
    shape = shape_of_spec(spec)
    measured = {s.name: s.mean_step_time_s for s in summarize(run)}
    for name in H200_STEPS[case]:
        placement = Placement(spec.get_strategy(name), spec.model.activation_checkpointing)
        step = predict(placement, shape, machine, links).step
        assert 0.8 <= measured[name] / step.seconds <= 1.2, (name, measured[name], step.seconds)


def test_plan_write_writes_the_files_it_wrote_before_the_engines_had_rooms(tmp_path):
    """tests/golden/plan_write: what `write_plan` wrote for these inputs before each engine's knowledge moved
    into its own folder (the paths of this test's folder written as TMP). Byte for byte."""
    from offloadlab.plan.output import write_plan

    batch = dict(seq_len=1024, micro_batch=4, grad_accum=1, precision="bf16", nvme_path=str(tmp_path))
    spec = load_spec(write_spec(tmp_path, [dict(name="any", engine="fsdp2")], model=dict(preset="gpt-1.4b"), **batch))
    shape, machine = shape_of_spec(spec), Machine(1, 80 * GiB, 512 * GiB, 1e13)
    buffers = buffers_for(shape)
    written = {}
    for name in ("zero3-opt-nvme-param-nvme", "zero2-cpu", "fsdp2-cpu-offload"):
        placement = next(p for p in candidate_placements() if p.name == name)
        x = predict(placement, shape, machine, LINKS, buffers)
        for path in write_plan(x, spec, tmp_path / "written", None, buffers, force=False):
            written[path.name] = path.read_text().replace(str(tmp_path), "TMP")
    golden = Path(__file__).parent / "golden" / "plan_write"
    assert written == {p.name: p.read_text() for p in golden.iterdir()}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_block_of_every_preset_is_measured_on_the_cpu(preset):
    """Without a GPU the block is narrowed to fewer heads of the same size: gpt-760m's heads of 96 did not
    divide the 1024 it was narrowed to (a traceback from `plan --model gpt-760m` on a machine without a GPU)."""
    from offloadlab.measure.links import measure_block_flops

    assert measure_block_flops(PRESETS[preset], 64, 1, "bf16", repeats=1) > 0


def test_plan_with_tflops_measures_no_block(tmp_path, monkeypatch):
    from offloadlab.measure import links

    def refuse(*_):
        raise AssertionError("--tflops was given: no block is measured")

    monkeypatch.setattr(links, "measure_block_flops", refuse)
    request = PlanRequest(preset="gpt-760m", gpu_mem_gib=24, tflops=300, pcie_gbps=25, tuned_dir=tmp_path)
    printed = io.StringIO()
    inputs = PlanInputs.gather(request, Console(file=printed))
    assert inputs.links.flops_per_s == 300e12 and inputs.links.flops_source == "given with --tflops"
    assert "warning" not in printed.getvalue()


def test_planning_for_a_gpu_on_a_machine_without_one_warns_that_step_times_are_the_cpus(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    printed = io.StringIO()
    request = PlanRequest(preset="gpt-760m", gpu_mem_gib=24, tuned_dir=tmp_path)
    PlanInputs.gather(request, Console(file=printed, width=200), links=LINKS)
    assert "step times come from this CPU's rate on one block; pass --tflops" in printed.getvalue()


def test_torchao_is_planned_for_one_gpu_only_with_the_model_whole_on_it():
    """torchao's CPUOffloadOptimizer keeps the fp32 model and its gradients on the GPU (and, under bf16
    autocast, each weight's bf16 copy), the fp32 masters and gradient copies pinned on the host, Adam's
    moments pageable; it needs CUDA and does not shard, so neither a CPU plan nor a 2-GPU one has it."""
    shape = _shape("gpt-1.4b")
    machines = {"one GPU": Machine(1, 80 * GiB, 1e15, None), "two": Machine(2, 80 * GiB, 1e15, None)}
    machines["no GPU"] = Machine(1, None, 1e15, None)
    names = {k: {x.placement.name for x in plan(shape, machine, LINKS)} for k, machine in machines.items()}
    # Where torchao is not installed (the test machine's default), it is planned nowhere.
    assert ("torchao-cpu-offload" in names["one GPU"]) == engine_for(
        TorchAOStrategy(name="a", engine="torchao")
    ).installed
    assert "torchao-cpu-offload" not in names["two"] | names["no GPU"]
    assert "fsdp2-cpu-offload" in names["two"] & names["no GPU"]
    on_gpu = predict(
        Placement(TorchAOStrategy(name="torchao-cpu-offload", engine="torchao")), shape, machines["one GPU"], LINKS
    )
    n = shape.n_params
    m = on_gpu.memory
    assert sum(m.gpu.values()) == pytest.approx(4 * n, rel=0.01)  # the small parameters' AdamW state is tiny
    assert m.gpu_turn["gradients (fp32)"] + m.gpu_turn["autocast's bf16 weight copies"] == pytest.approx(6 * n)
    assert m.pinned_bytes == pytest.approx(8 * n, rel=0.01)
    assert m.host_pageable["optimizer states"] == pytest.approx(8 * n, rel=0.01)
    assert on_gpu.step.parts["cpu_adam"] == pytest.approx(n / LINKS.cpu_adam_params_per_s, rel=0.01)
    freed = predict(on_gpu.placement.varied("ao-freed", offload_gradients=True), shape, machines["one GPU"], LINKS)
    assert freed.memory.gpu_bytes == pytest.approx(m.gpu_bytes - 4 * n + 4 * shape.largest_param_numel)
    # bf16 master weights: the model, gradients, masters and moments all bf16, no autocast copies, half the
    # PCIe bytes; the variant is offered for bf16 runs only, as an inexact option.
    (bf16,) = engine_for(on_gpu.placement.strategy).placements.inexact_options(on_gpu.placement, "bf16", True, 1)
    assert bf16.name == "torchao-cpu-offload-bf16master" and not bf16.strategy.exact
    assert not engine_for(bf16.strategy).placements.inexact_options(on_gpu.placement, "fp32", True, 1)
    halved = predict(bf16, shape, machines["one GPU"], LINKS)
    assert halved.memory.gpu_turn["gradients (bf16)"] == pytest.approx(2 * n)
    assert "autocast's bf16 weight copies" not in halved.memory.gpu_turn
    assert halved.memory.pinned_bytes == pytest.approx(m.pinned_bytes / 2)
    assert halved.memory.host_pageable["optimizer states"] == pytest.approx(4 * n, rel=0.01)
    assert halved.step.bytes_moved["pcie_h2d"] == pytest.approx(on_gpu.step.bytes_moved["pcie_h2d"] / 2)
    # ratio: the first parameters, up to (1 - ratio) of the offloaded elements, step on the GPU, their
    # moments there; the CPU's step, the host's bytes and the copies shrink by that share.
    offloaded = on_gpu.step.bytes_moved["pcie_h2d"] / 4
    half = predict(on_gpu.placement.varied("ao-half", ratio=0.5), shape, machines["one GPU"], LINKS)
    on_cpu = half.step.bytes_moved["pcie_h2d"] / 4
    assert 0.45 * offloaded < on_cpu < 0.55 * offloaded  # whole parameters: near half, not exactly
    assert half.memory.gpu_bytes - m.gpu_bytes == pytest.approx(8 * (offloaded - on_cpu))
    assert half.memory.host_pageable["optimizer states"] == pytest.approx(8 * on_cpu)
    assert half.step.parts["cpu_adam"] == pytest.approx(on_cpu / LINKS.cpu_adam_params_per_s)
    # The plan offers the smallest ratio whose moments fit the GPU's spare bytes: on 80 GB, a tenth.
    plan_80 = {x.placement.name: x for x in plan(shape, machines["one GPU"], LINKS, also=(bf16,))}
    if "torchao-cpu-offload" in plan_80:
        assert plan_80["torchao-cpu-offload-ratio0.1"].placement.strategy.ratio == 0.1
        assert plan_80["torchao-cpu-offload-bf16master-ratio0.1"].fits
    placements = engine_for(bf16.strategy).placements
    moments = 2 * 2 * shape.n_params  # bf16 m and v
    assert [x.strategy.ratio for x in placements.partial_offloads(bf16, shape, 1, 0.25 * moments)] == [
        0.8,
        0.9,
    ]
    assert placements.partial_offloads(half.placement, shape, 1, moments) == []
    # A spec's own torchao strategy is not planned where no GPU is (it once won a CPU host's plan): plan
    # prints why instead.
    assert bf16.name not in {x.placement.name for x in plan(shape, machines["no GPU"], LINKS, also=(bf16,))}
    assert why_not_runnable(bf16, machines["no GPU"]) == bf16.strategy.needs_cuda
    assert "one GPU" in why_not_runnable(bf16, machines["two"])


def test_plan_and_autotune_say_which_of_a_specs_strategies_this_machine_would_refuse(tmp_path):
    """Left out of the plan (and autotune's search), not silently: each with why, grouped by reason."""
    strategies = [dict(name="ao", engine="torchao"), dict(name="ao-half", engine="torchao", ratio=0.5)]
    spec = write_spec(tmp_path, [*strategies, dict(name="f", engine="fsdp2")], precision="bf16")
    inputs = PlanInputs.gather(
        PlanRequest(spec_path=spec, tuned_dir=tmp_path), Console(file=io.StringIO()), links=LINKS
    )
    if inputs.machine.gpu_mem_bytes is not None:
        pytest.skip("this machine has a GPU")
    assert set(not_planned(inputs)) == {"ao", "ao-half"}
    text = not_planned_text(inputs)
    assert text.startswith("not planned on this machine: ao, ao-half: ") and text.count("\n") == 0
    names = {c.placement_name for c in search_space(inputs)}
    assert names and not any(name.startswith("ao") for name in names)
