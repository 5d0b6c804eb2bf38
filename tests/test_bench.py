"""The bench scripts' own logic: what at_scale runs and writes, what the tuner comparison reports."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from rich.console import Console

from conftest import REPO, load_bench
from offloadlab.plan.accounting import Links, Machine
from offloadlab.spec import load_spec

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


def test_the_budget_grid_holds_the_same_placements_around_the_largest_gpt():
    """bench/budget_grid.py's cells for session 16's `plan --largest --gpu-mem 24` on the H200 (7.67B, 36
    layers): 35-37 layers, the two placements that fit and the one least over."""
    grid = load_bench("budget_grid")
    spec, machine, links = grid_on_the_h200(GRID_24, 24)
    cells = grid.grid_cells(spec, machine, links, around=1, count=3)
    assert [c.n_layers for c in cells] == [35] * 3 + [36] * 3 + [37] * 3
    names = [c.planned.placement.name for c in cells[3:6]]
    assert names[:2] == ["fsdp2-cpu-offload-dsadam", "fsdp2-cpu-offload"]  # what fits, fastest first
    third = cells[5].planned
    others = [x for x in plan_at(spec, machine, links) if not x.fits and x.placement.name not in names[:2]]
    assert not third.fits and third.use == min(x.use for x in others)
    assert [c.planned.fits for c in cells[3:5]] == [True, True] and not any(c.planned.fits for c in cells[6:])
    assert all(a.n_params < b.n_params for a, b in zip(cells[0::3], cells[3::3]))
    # Each cell's spec: the base spec at that size with the placement as its only strategy, a few steps.
    raw = grid.cell_spec(spec, cells[6], steps=4)
    assert raw["model"]["n_layers"] == 37 and raw["steps"] == 4 and not raw["verify_checkpoint"]
    assert [s["name"] for s in raw["strategy"]] == ["fsdp2-cpu-offload-dsadam"]
    assert raw["gpu_memory_limit_gib"] == 24.0
    # The verdicts: a fit that trains agrees, a "does not fit" that trains does not, a failure settles nothing.
    fit, unfit = cells[3], cells[6]
    fit.status, unfit.status = "done", "done"
    assert fit.agrees is True and unfit.agrees is False
    unfit.status = "does_not_fit"
    assert unfit.agrees is True
    fit.status = "failed"
    assert fit.agrees is None


def test_a_stopped_budget_grid_goes_on_from_the_cells_it_settled(tmp_path):
    """The grid is written after each cell; run again, the settled cells keep their outcome and peaks, the
    rest are run; a grid of another budget in the same folder is refused."""
    grid = load_bench("budget_grid")
    spec, machine, links = grid_on_the_h200(GRID_24, 24)
    cells = grid.grid_cells(spec, machine, links, around=1, count=3)
    cells[0].status, cells[0].outcome, cells[0].gpu_reserved_gib, cells[0].host_rss_gib = "done", "trained", 21.5, 118
    grid_json = tmp_path / "grid.json"
    grid.write_grid(cells, 24.0, grid_json)
    again = grid.grid_cells(spec, machine, links, around=1, count=3)
    grid.resume(again, tmp_path, 24.0)
    assert (again[0].status, again[0].gpu_reserved_gib, again[0].host_rss_gib) == ("done", 21.5, 118)
    assert again[0].agrees is True and {c.status for c in again[1:]} == {"not run"}
    with pytest.raises(SystemExit, match="a grid at 24 GiB, not 48"):
        grid.resume(again, tmp_path, 48.0)


def test_every_verdict_of_the_plan_in_the_24_gib_grid_is_what_the_run_found():
    """No false fits: the nine cells session 16 ran on the H200 under 24 GiB (35-37 layers of the largest
    GPT's width, the plan's top three placements), each judged again by the planner as it is now. Four
    trained, five were killed on host RAM; session 15's run of 37 layers under 48 GiB was killed too."""
    cells = judged_again(GRID_24, 24)
    assert [c.agrees for c in cells] == [True] * 9
    assert sum(c.planned.fits for c in cells) == 4
    # Under 48 GiB on session 15's machine (124.3 GiB available), the same GPT one layer larger
    spec, _, links = grid_on_the_h200(GRID_24, 24)
    s15 = REPO / "bench/results/2026-12-04-h200-s15"
    planned = json.loads((s15 / "budget_24/plan_24.json").read_text())
    at_48 = Machine(**{**planned["machine"], "gpu_mem_bytes": 48 * 2**30})
    grid = load_bench("budget_grid")
    fits = {c.n_layers: c.planned.fits for c in grid.grid_cells(spec, at_48, links, around=1, count=1)}
    assert fits == {35: True, 36: True, 37: False}


def test_every_cell_run_in_the_48_gib_grid_is_what_the_plan_says():
    """The grid under 48 GiB (sessions 17 and 19): host RAM binds alone, so the plan's third placement is
    ZeRO-3 with its parameters on the GPU. All nine cells ran: the four the plan fits trained, the five it
    does not were killed on host RAM, the 37-layer row with DeepSpeed's CPU Adam among them."""
    cells = judged_again(GRID_48, 48)
    assert [c.planned.placement.name for c in cells[:3]] == [
        "fsdp2-cpu-offload-dsadam", "fsdp2-cpu-offload", "zero3-opt-cpu"
    ]  # fmt: skip
    assert [c.agrees for c in cells] == [True] * 9 and sum(c.planned.fits for c in cells) == 4
    assert all(c.planned.binds == "host" for c in cells)
    assert [c.status for c in cells[6:]] == ["does_not_fit"] * 3 and not any(c.planned.fits for c in cells[6:])


@pytest.mark.slow
def test_a_dry_run_judges_a_partial_grid_again_and_writes_nothing(tmp_path):
    """--dry-run on an unpacked grid that stopped part way: the settled cells are read from their stores
    and judged, the rest are shown not run, and nothing in the folder is written or run."""
    with tarfile.open(GRID_48_PART / "grid_48.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    out = tmp_path / "grid_48"
    before = {f: f.stat().st_mtime_ns for f in out.rglob("*")}
    shown = subprocess.run(
        [sys.executable, str(REPO / "bench/budget_grid.py"), "--plan", str(GRID_48_PART / "plan_48.json"),
         "--spec", str(GRID_48_PART / "spec_48.toml"), "--gpu-mem", "48", "--out", str(out), "--dry-run"],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "80"},
    ).stdout  # fmt: skip
    assert shown == (GRID_48_PART / "grid_48_table.txt").read_text()
    assert shown.count("yes") == 6 and shown.count("not run") == 3
    assert {f: f.stat().st_mtime_ns for f in out.rglob("*")} == before


def test_a_grid_with_too_little_time_left_stops_before_a_cell_not_in_it(tmp_path):
    """--stop-by: a cell is begun only where the longest one timed so far would end in time; otherwise the
    grid stops as Ctrl-C would, having written no spec for the cell it did not begin."""
    grid = load_bench("budget_grid")
    spec, machine, links = grid_on_the_h200(GRID_24, 24)
    cells = grid.grid_cells(spec, machine, links, around=1, count=3)
    now = time.monotonic()
    assert not grid.out_of_time(cells, now, stop_by=1.0)  # nothing timed yet: the first cell runs
    cells[0].status, cells[0].seconds = "done", 150.0
    assert grid.out_of_time(cells, now, stop_by=120.0)
    assert not grid.out_of_time(cells, now, stop_by=200.0) and not grid.out_of_time(cells, now, stop_by=None)
    assert grid.out_of_time(cells, now - 60, stop_by=200.0)  # a minute gone, 150 s more would end at 210
    args = argparse.Namespace(out=tmp_path, stop_by=120.0, steps=3, gpu_mem=24.0, timeout=420.0)
    with pytest.raises(KeyboardInterrupt):
        grid.run_grid(cells, spec, args, Console(file=io.StringIO()))
    assert list(tmp_path.iterdir()) == []
    # The time a cell took goes into grid.json and comes back with it.
    grid.write_grid(cells, 24.0, tmp_path / "grid.json")
    again = grid.grid_cells(spec, machine, links, around=1, count=3)
    grid.resume(again, tmp_path, 24.0)
    assert again[0].seconds == 150.0 and again[1].seconds is None


GRID_24 = REPO / "bench/results/2026-12-04-h200-s16/grid_24"
GRID_48 = REPO / "bench/results/2026-12-05-h200-s19/grid_48"
GRID_48_PART = REPO / "bench/results/2026-12-04-h200-s17/grid_48"  # six of nine cells, as session 17 left it


def grid_on_the_h200(folder: Path, gpu_mem: int):
    planned = json.loads((folder / f"plan_{gpu_mem}.json").read_text())
    return load_spec(folder / f"spec_{gpu_mem}.toml"), Machine(**planned["machine"]), Links(**planned["links"])


def judged_again(folder: Path, gpu_mem: int) -> list:
    """The grid's cells as the planner makes them now, each with the outcome its run had on the machine.
    The grid keeps its own placements, whatever the planner has added since (FSDP2's `-kept`)."""
    grid = load_bench("budget_grid")
    cells = grid.grid_cells(*grid_on_the_h200(folder, gpu_mem), 1, 3, grid.placements_begun(folder))
    ran = json.loads((folder / "grid.json").read_text())
    assert ran["gpu_mem_gib"] == gpu_mem
    outcome = {(r["n_layers"], r["placement"]): r["status"] for r in ran["cells"]}
    assert {(c.n_layers, c.planned.placement.name) for c in cells} == set(outcome)
    for c in cells:
        c.status = outcome[(c.n_layers, c.planned.placement.name)]
    return cells


def plan_at(spec, machine, links):
    from offloadlab.engines.deepspeed.buffers import buffers_for
    from offloadlab.plan.accounting import shape_of_spec
    from offloadlab.plan.predict import plan

    shape = shape_of_spec(spec)
    return plan(shape, machine, links, buffers_for(shape))
