"""The tables `offloadlab tune` prints: the best points, the winner against DeepSpeed's default, and the
parameter swap buffers."""

from __future__ import annotations

from rich.table import Table

from offloadlab.measure.aio_bench import Throughput
from offloadlab.tune.search import PointResult, TuneResult, mixed_score
from offloadlab.tune.swap_buffers import SwapBufferPlan


def _row(
    label: str, read: float, write: float, read_share: float, spreads: tuple[float, float] | None = None
) -> list[str]:
    rs, ws = spreads or (None, None)
    fmt = lambda v, s: f"{v:.2f}" + (f" ±{100 * s / 2:.0f}%" if s else "")  # noqa: E731 - local formatter
    return [label, fmt(read, rs), fmt(write, ws), f"{mixed_score(read, write, read_share):.2f}"]


def points_table(result: TuneResult, top: int = 10) -> Table:
    table = Table(
        title=f"aio points, best {top} of {len(result.results)} (GB/s, mean ± half spread)", header_style="bold"
    )
    for col in ("point", "read", "write", "score", "repeats", "stage"):
        table.add_column(col, justify="left" if col in ("point", "stage") else "right")
    for r in result.results[:top]:
        style = "bold green" if r is result.best else ("cyan" if r is result.default else "")
        table.add_row(
            *_row(r.point.label(), r.read_gbps, r.write_gbps, result.read_share, (r.read_spread, r.write_spread)),
            str(len(r.samples)),
            r.stage,
            style=style,
        )
    return table


def summary_table(result: TuneResult) -> Table:
    table = Table(
        title=f"tune {result.path}: workload {result.workload} (read share {result.read_share:.2f}), "
        f"{result.measurements} measurements in {result.seconds:.1f} s",
        header_style="bold",
    )
    for col in ("setting", "read GB/s", "write GB/s", "score GB/s", "vs default"):
        table.add_column(col, justify="left" if col == "setting" else "right")
    default_score = result.default.score(result.read_share)

    def add(label: str, t: PointResult | Throughput, style: str = "") -> None:
        row = _row(label, t.read_gbps, t.write_gbps, result.read_share)
        table.add_row(
            *row, f"{mixed_score(t.read_gbps, t.write_gbps, result.read_share) / default_score:.2f}x", style=style
        )

    add(f"best: {result.best.point.label()}", result.best, "bold green")
    add(f"DeepSpeed default: {result.default.point.label()}", result.default)
    add("plain O_DIRECT, 1 MiB sequential, 1 thread", result.direct_io)
    if result.pcie:
        table.caption = (
            f"drive <-> pinned RAM figures; a swap-in then crosses PCIe: pinned copy to GPU "
            f"{result.pcie.host_to_device_gbps:.1f} GB/s, from GPU {result.pcie.device_to_host_gbps:.1f} GB/s"
        )
    return table


def plan_table(plan: SwapBufferPlan) -> Table:
    table = Table(title="parameter swap buffers (offload_param = nvme)", header_style="bold")
    table.add_column("setting")
    table.add_column("value", justify="right")
    table.add_column("why")
    table.add_row(
        "buffer_size", f"{plan.buffer_size:,}", f"largest parameter {plan.largest_param_numel:,} elements, aligned"
    )
    table.add_row(
        "buffer_count", str(plan.buffer_count), f"parameters live at once (of {plan.swapped_params} swapped) + 2"
    )
    table.add_row("stage3_max_live_parameters", f"{plan.stage3_max_live_parameters:,}", "about four blocks")
    table.add_row("stage3_max_reuse_distance", f"{plan.stage3_max_reuse_distance:,}", "same window")
    table.add_row(
        "pinned RAM, parameters",
        f"{plan.param_pinned_bytes / 2**30:.2f} GiB",
        "buffer_size x buffer_count x element size",
    )
    if plan.optimizer_buffer_count:
        table.add_row(
            "pinned RAM, optimizer",
            f"{plan.optimizer_pinned_bytes / 2**30:.2f} GiB",
            f"optimizer_buffer_count x largest sub-group ({plan.optimizer_buffer_numel:,}) x 4 B",
        )
    return table
