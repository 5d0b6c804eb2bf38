"""The tables `offloadlab tune` prints: the best points, the winner against DeepSpeed's default, and the
parameter swap buffers."""

from __future__ import annotations

from rich.table import Table

from offloadlab.engines.deepspeed.buffers import SAFETY_BUFFERS, SwapBuffers, swap_buffer_bytes, swapped_numels
from offloadlab.measure.aio_bench import Throughput
from offloadlab.plan.accounting import Placement, shape_of_spec
from offloadlab.spec import AioSettings, DeepSpeedStrategy, RunSpec
from offloadlab.tune.search import PointResult, TuneResult, mixed_score


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


def swap_buffers_table(spec: RunSpec, strategy: DeepSpeedStrategy, buffers: SwapBuffers, aio: AioSettings) -> Table:
    """The buffers the tune sized for the spec's NVMe strategy, and the pinned RAM they take."""
    shape = shape_of_spec(spec)
    pinned = swap_buffer_bytes(Placement(strategy), shape, spec.nproc, buffers)
    swapped = len(swapped_numels(shape, strategy, spec.nproc, aio))
    table = Table(title="parameter swap buffers (offload_param = nvme)", header_style="bold")
    table.add_column("setting")
    table.add_column("value", justify="right")
    table.add_column("why")
    table.add_row(
        "buffer_size",
        f"{buffers.param_buffer_size:,}",
        f"largest parameter {shape.largest_param_numel:,} elements, aligned",
    )
    table.add_row(
        "buffer_count",
        str(buffers.param_buffer_count),
        f"parameters live at once (of {swapped} swapped) + {SAFETY_BUFFERS}",
    )
    table.add_row("stage3_max_live_parameters", f"{buffers.stage3_max_live_parameters:,}", "about four blocks")
    table.add_row("stage3_max_reuse_distance", f"{buffers.stage3_max_reuse_distance:,}", "same window")
    for what, sizes in pinned.items():
        table.add_row(f"pinned RAM, {what}", f"{sum(sizes) / 2**30:.2f} GiB", f"{len(sizes)} x {sizes[0]:,.0f} B")
    return table
