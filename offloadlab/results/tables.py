"""How a run's figures are written for people: byte sizes, and `offloadlab compare`'s table."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from offloadlab.results.status import Status
from offloadlab.results.summary import StrategySummary


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _gb(bytes_per_s: float | None) -> float | None:
    return None if bytes_per_s is None else bytes_per_s / 1e9


def stalls(s: StrategySummary) -> Text:
    if s.stalls is None:
        return Text("-")
    return Text(f"{s.stalls} stall{'s' * (s.stalls != 1)}", style="bold red" if s.stalls else "")


def loss_deviation(s: StrategySummary) -> Text:
    """The last loss against exact AdamW's; an inexact strategy's is marked, however small."""
    if s.last_loss_deviation is None:
        return Text("-")
    return Text(f"{s.last_loss_deviation:+.2%}", style="" if s.exact else "yellow")


def compare_table(run_dir: Path, summaries: list[StrategySummary]) -> Table:
    # Text from the store and paths (a reason quoting "[rank0]", a folder named "[x]") is never read as markup.
    table = Table(title=Text(f"offloadlab compare {run_dir}"), header_style="bold")
    for col in (
        "strategy",
        "status",
        "step s\np50 / p90",
        "max s\nstalls",
        "tokens/s\nMFU",
        "practical\nΔ loss",
        "GPU peak\nalloc / resv",
        "host RSS\npeak",
        "NVMe/step\nread / write",
        "GPU\nidle",
        "PCIe GB/s\ntx / rx",
        "comm/step\nbytes / s",
        "SSD writes\nper 10k steps",
        "checkpoint",
    ):
        text = col in ("strategy", "status", "checkpoint")
        table.add_column(col, justify="left" if text else "right", no_wrap=col != "status", overflow="fold")
    for s in summaries:
        status = s.status.label + ("" if s.status is Status.DONE else f" ({s.steps_done}/{s.steps_planned})")
        if s.reason and s.status is not Status.DONE:
            status += f": {s.reason}"
        ckpt = {True: "[green]verified[/]", False: "[red]FAILED[/]", None: "-"}[s.checkpoint_verified]
        table.add_row(
            Text.assemble(s.name, ("\n" + s.engine, "dim")),
            Text(status, style=s.status.style),
            f"{_fmt(s.median_step_time_s, '{:.3f}')}\n{_fmt(s.p90_step_time_s, '{:.3f}')}",
            f"{_fmt(s.max_step_time_s, '{:.2f}')}\n{stalls(s)}",
            f"{_fmt(s.tokens_per_s, '{:,.0f}')}\n{_fmt(s.mfu_percent, '{:.1f}%')}",
            f"{_fmt(s.practicality, '{:.0%}')}\n{loss_deviation(s)}",
            f"{human_bytes(s.peak_allocated_bytes)}\n{human_bytes(s.peak_reserved_bytes)}",
            human_bytes(s.host_rss_peak_bytes),
            f"{human_bytes(s.disk_read_bytes_per_step)}\n{human_bytes(s.disk_write_bytes_per_step)}",
            _fmt(None if s.gpu_idle_share is None else 100 * s.gpu_idle_share, "{:.0f}%"),
            f"{_fmt(_gb(s.pcie_tx_bytes_per_s), '{:.1f}')}\n{_fmt(_gb(s.pcie_rx_bytes_per_s), '{:.1f}')}",
            f"{human_bytes(s.comm_bytes_per_step)}\n{_fmt(s.comm_seconds_per_step, '{:.3f}')}",
            human_bytes(None if s.disk_write_bytes_per_step is None else 1e4 * s.disk_write_bytes_per_step),
            ckpt,
        )
    return table
