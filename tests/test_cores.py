"""Each rank is bound to its own physical cores and runs its CPU optimizer on as many threads (torchrun
alone gave every rank of two or more OMP_NUM_THREADS=1); the cores, the threads and the optimizer's
measured rate are in the run store and compare."""

from __future__ import annotations

import json

import pytest

from conftest import cli, write_spec
from offloadlab.spec import SpecError
from offloadlab.train.cores import cores_for_rank, physical_cores


def test_ranks_get_disjoint_runs_of_cores_and_a_count_the_host_lacks_names_the_fix():
    cores = [0, 2, 4, 6, 8, 10, 12, 14]  # one hardware thread of each of 8 cores
    assert [cores_for_rank(r, 2, None, cores) for r in (0, 1)] == [[0, 2, 4, 6], [8, 10, 12, 14]]
    assert [cores_for_rank(r, 4, 1, cores) for r in range(4)] == [[0], [2], [4], [6]]
    assert cores_for_rank(0, 16, None, cores) == cores  # more ranks than cores: they share them
    with pytest.raises(SpecError, match="cpu_cores_per_rank = 5 for 2 rank.* needs 10 physical cores; this host"):
        cores_for_rank(0, 2, 5, cores)


def test_the_run_binds_each_rank_and_records_its_cores_threads_and_optimizer_rate(tmp_path):
    host = physical_cores()
    strategies = [
        dict(name="zero2-cpu", engine="deepspeed", zero_stage=2, offload_optimizer="cpu"),
        dict(name="fsdp2-one-core", engine="fsdp2", cpu_offload=True, cpu_cores_per_rank=1),
    ]
    spec = write_spec(tmp_path, strategies, verify_checkpoint=False)
    cli("run", str(spec), "--out", str(tmp_path / "run"))
    by_name = {s["name"]: s for s in json.loads(cli("compare", str(tmp_path / "run"), "--json").stdout)}
    assert by_name["zero2-cpu"]["cpu_threads"] == len(host) and by_name["zero2-cpu"]["cpu_cores"] == host
    assert by_name["fsdp2-one-core"]["cpu_threads"] == 1 and by_name["fsdp2-one-core"]["cpu_cores"] == host[:1]
    assert all(s["optimizer_params_per_s"] > 0 for s in by_name.values())
    from rich.console import Console

    from offloadlab.results.store import RunStore
    from offloadlab.results.summary import summarize
    from offloadlab.results.tables import compare_table

    console = Console(width=260, record=True)
    console.print(compare_table(tmp_path / "run", summarize(RunStore(tmp_path / "run")), 260))
    assert "opt threads" in console.export_text()


def test_more_cores_than_the_host_has_is_refused_before_anything_starts(tmp_path):
    spec = write_spec(tmp_path, [dict(name="f", engine="fsdp2", cpu_cores_per_rank=4096)])
    proc = cli("run", str(spec), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2 and "lower cpu_cores_per_rank or leave it out" in proc.stderr
    assert not (tmp_path / "run").exists()
