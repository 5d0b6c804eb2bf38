"""Issue 22 on one GPU: the fastest offload for a model that does not fit, judged by throughput, stalls,
practicality and loss, with the planner's GPU peak beside the measured one.

    python bench/fastest_offload.py split configs/fastest_offload_h200.toml DIR   # DIR/a.toml ... d.toml
    offloadlab run DIR/a.toml --out RUN_A; offloadlab run DIR/b.toml --out RUN_B    # back to back, one machine
    python bench/fastest_offload.py table RUN_A RUN_B

Each part runs FSDP2 without offload too, so each run's practicality and loss deviation are its own; the
parts exist only because one device call is limited to 10 minutes. Part c is SuperOffload beside its
ZeRO-3 counterpart, for a machine where b's time ran out before it; part d the options of issue 37 (bf16
master weights, ZenFlow with automatic selection and a long update interval) beside exact ZeRO-2.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import tomli_w
from rich.console import Console
from rich.table import Table

PARTS = {
    "a": ("fsdp2", "zero2-cpu", "zero2-cpu-zenflow", "fsdp2-cpu-dsadam"),
    "b": ("fsdp2", "fsdp2-cpu-offload", "zero3-cpu", "zero3-opt-cpu", "zero3-opt-cpu-super"),
    "c": ("zero3-opt-cpu-super", "zero3-opt-cpu", "fsdp2"),
    "d": ("fsdp2", "zero2-cpu", "zero2-cpu-bf16", "zero2-cpu-zenflow-auto16"),
}


def split(spec_path: Path, folder: Path) -> None:
    spec = tomllib.loads(spec_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    by_name = {s["name"]: s for s in spec["strategy"]}
    for part_name, names in PARTS.items():
        part = {**spec, "name": f"{spec['name']}-{part_name}", "strategy": [by_name[n] for n in names]}
        (folder / f"{part_name}.toml").write_text(tomli_w.dumps(part))


def table(run_dirs: list[Path]) -> Table:
    from offloadlab.plan.accounting import Placement, shape_of_spec
    from offloadlab.plan.predict import predict_memory
    from offloadlab.results.store import RunStore
    from offloadlab.results.summary import summarize
    from offloadlab.results.tables import fmt_or_dash
    from offloadlab.spec import parse_spec

    out = Table(title="1.42B GPT, bf16, 4 x 1024 tokens a step, one H200", header_style="bold")
    columns = ("run", "strategy", "tokens/s", "p50 s", "p90 s", "max s", "stalls", "practical", "last loss",
               "vs exact", "GPU peak GiB", "planned", "host RSS GiB")  # fmt: skip
    for col in columns:
        out.add_column(col, justify="left" if col in ("run", "strategy") else "right")
    for run_dir in run_dirs:
        store = RunStore(run_dir)
        spec = parse_spec(tomllib.loads(store.run()["spec_toml"]))
        shape = shape_of_spec(spec)
        for s in summarize(store):
            planned = predict_memory(Placement(spec.get_strategy(s.name)), shape, spec.nproc).gpu_bytes
            out.add_row(
                run_dir.name,
                s.name,
                fmt_or_dash(s.tokens_per_s, "{:,.0f}"),
                fmt_or_dash(s.median_step_time_s, "{:.3f}"),
                fmt_or_dash(s.p90_step_time_s, "{:.3f}"),
                fmt_or_dash(s.max_step_time_s, "{:.2f}"),
                fmt_or_dash(s.stalls, "{}"),
                fmt_or_dash(s.practicality, "{:.1%}"),
                fmt_or_dash(s.last_loss, "{:.4f}"),
                fmt_or_dash(s.last_loss_deviation, "{:+.2%}"),
                fmt_or_dash(None if s.peak_allocated_bytes is None else s.peak_allocated_bytes / 2**30, "{:.2f}"),
                f"{planned / 2**30:.2f}",
                fmt_or_dash(None if s.host_rss_peak_bytes is None else s.host_rss_peak_bytes / 2**30, "{:.1f}"),
            )
    return out


if __name__ == "__main__":
    if sys.argv[1] == "split":
        split(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        Console(width=200).print(table([Path(p) for p in sys.argv[2:]]))
