"""Run specs: shipped configs load; bad ones fail before any work with a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, cli, write_spec
from offloadlab.spec import SpecError, load_spec, parse_spec

BASE = dict(model=dict(preset="tiny"), strategy=[dict(name="a", engine="fsdp2")])


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    spec = load_spec(path)
    assert spec.strategy


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(stepz=3), "stepz: unknown key (did you mean 'steps'?)"),
        (
            dict(strategy=[dict(name="a", engine="deepspeed", zero_stag=2)]),
            "strategy.0.zero_stag: unknown key (did you mean 'zero_stage'?)",
        ),
        (
            dict(strategy=[dict(name="a", engine="fsdp2", ratio=0.5)]),
            'strategy.0.ratio: unknown key for engine = "fsdp2": engine = "deepspeed" and engine = "torchao" '
            "strategies take it",
        ),
        (
            dict(strategy=[dict(name="a", engine="deepspeed", aio=dict(num_threads=4))]),
            "strategy.0.aio.num_threads: unknown key (did you mean 'intra_op_parallelism'?)",
        ),
        (
            dict(strategy=[dict(name="a", engine="deepspeed", zero_stage=2, offload_param="cpu")]),
            "offload_param = 'cpu' needs zero_stage = 3",
        ),
        (
            dict(strategy=[dict(name="a", engine="deepspeed", zero_stage=3, offload_optimizer="nvme")]),
            "a strategy offloads to nvme: set nvme_path",
        ),
        (
            dict(strategy=[dict(name="a", engine="dsp")]),
            "does not match any of the expected tags: 'deepspeed', 'fsdp2'",
        ),
        (
            dict(strategy=[dict(name="a", engine="fsdp2"), dict(name="a", engine="fsdp2")]),
            "strategy names must be unique: a",
        ),
        (dict(precision="fp16"), "precision: Input should be 'fp32' or 'bf16'"),
        (dict(steps=0), "steps: Input should be greater than 0"),
        (dict(model=dict()), "set model.preset, model.hf_model, model.hf_config, or all of"),
        (dict(model=dict(preset="tiny", hf_model="m")), "set only one of model.preset and model.hf_model"),
        (dict(data=dict(kind="tokens")), 'data.kind = "tokens" needs data.path'),
        (dict(checkpoint_step=9, steps=4), "checkpoint_step = 9 must be below steps = 4"),
    ],
)
def test_bad_specs_are_rejected_with_the_key_named(change, message):
    with pytest.raises(SpecError) as err:
        parse_spec({**BASE, **change})
    assert message in str(err.value)


@pytest.mark.slow
def test_unknown_preset_lists_the_presets(tmp_path):
    spec = write_spec(tmp_path, [dict(name="a", engine="fsdp2")], model=dict(preset="gpt-9t"))
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    assert "model.preset 'gpt-9t' is unknown: did you mean 'gpt-70b'? presets: tiny" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("typed", "meant"), [("gpt-1.3b", "gpt-1.4b"), ("gpt-7b", "gpt-6.7b"), ("gpt-13", "gpt-13b"), ("tinny", "tiny")]
)
def test_a_mistyped_preset_is_answered_with_the_nearest_one(typed, meant):
    """By size where the name gives one (spelling alone takes gpt-1.3b for gpt-13b), else by spelling."""
    from offloadlab.spec import ModelSpec
    from offloadlab.workload.model import gpt_config

    with pytest.raises(SpecError, match=f"did you mean '{meant}'"):
        gpt_config(ModelSpec(preset=typed), 64)


@pytest.mark.slow
def test_cli_reports_spec_errors_before_any_work(tmp_path):
    spec = write_spec(
        tmp_path,
        [dict(name="a", engine="deepspeed", zero_stage=3, offload_optimizer="nvme")],
        nvme_path=str(tmp_path / "missing"),
    )
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    assert f"nvme_path {tmp_path / 'missing'} does not exist" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_missing_spec_file_names_the_examples(tmp_path):
    with pytest.raises(SpecError, match="does not exist; 'offloadlab init DIR' writes the shipped examples"):
        load_spec(Path(tmp_path / "nope.toml"))


@pytest.mark.slow
def test_init_writes_the_shipped_examples_and_never_overwrites(tmp_path):
    """What the error above points at works outside the repo: the examples come from the installed package."""
    folder = tmp_path / "examples"
    proc = cli("init", str(folder), cwd=tmp_path)
    written = sorted(p.name for p in folder.iterdir())
    assert written == sorted(p.name for p in (REPO / "configs").glob("*.toml")), proc.stdout
    for name in written:
        assert (folder / name).read_text() == (REPO / "configs" / name).read_text()
        assert load_spec(folder / name).strategy
    (folder / "tiny_cpu.toml").write_text("# the user's own edits")
    again = cli("init", str(folder), cwd=tmp_path, check=False)
    assert again.returncode == 2 and "already holds" in again.stderr
    assert (folder / "tiny_cpu.toml").read_text() == "# the user's own edits"
