"""The bench scripts' own logic: what at_scale runs and writes, what the tuner comparison reports."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from conftest import REPO, load_bench

S4_STORE = REPO / "bench/results/2026-12-02-h200-s4/at_scale-1.4b"


def test_at_scale_only_runs_the_strategies_in_the_order_given():
    at_scale = load_bench("at_scale")
    spec = REPO / "configs/gpt1.4b_h200.toml"
    chosen = at_scale.strategies_with_twins(spec, None, ["zero3-nvme-tuned", "zero2-cpu", "zero3-nvme"])
    assert [s["name"] for s in chosen] == ["zero3-nvme-tuned", "zero2-cpu", "zero3-nvme"]
    assert chosen[0]["offload_param"] == "nvme"  # the twin is the NVMe strategy's copy


@pytest.mark.slow
def test_at_scale_from_results_writes_the_tables_of_a_cut_off_run(tmp_path):
    """Session 4's H200 run was cut off before at_scale.md: its store alone gives compare, report and floors."""
    results = tmp_path / "s4"
    shutil.copytree(S4_STORE, results, ignore=shutil.ignore_patterns("at_scale.md", "report.html"))
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/at_scale.py"),
            str(REPO / "configs/gpt1.4b_h200.toml"),
            "--results",
            str(results),
            "--from-results",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    text = (results / "at_scale.md").read_text()
    assert "offloadlab compare" in text and "step / floor" in text
    assert "zero3-nvme-tuned" in text and "1.16x" in text  # 27.13 s over its measured drive floor
    assert (results / "report.html").is_file()


def test_tuner_comparison_reports_when_ds_nvme_tune_finished_no_point():
    compare = load_bench("tune_vs_ds_nvme_tune")
    ours = {
        "wall_s": 50.0,
        "sweep_s": 45.0,
        "read_gbps": 2.0,
        "write_gbps": 3.0,
        "config": compare.AioSettings().model_dump(),
    }
    stopped = {"wall_s": 100.0, "finished": False, "read_points_done": 0, "write_points_done": 0}
    console = Console(record=True, width=200)
    assert compare.print_report(console, Path("X"), 1.0, ours, stopped, None, "offloadlab tune") == {}
    text = console.export_text()
    assert "no point finished" in text and "bs=1024K qd=8" in text


@pytest.mark.slow
def test_at_scale_from_results_names_what_a_folder_lacks(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/at_scale.py"),
            str(REPO / "configs/gpt1.4b_h200.toml"),
            "--results",
            str(tmp_path),
            "--from-results",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "lacks offloadlab.sqlite, spec.toml, tune.json" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written
