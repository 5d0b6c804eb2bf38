"""Side-by-side figures of a run's strategies, computed from the run store (used by `compare`, `report`, TUI)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from rich.table import Table

from offloadlab import metrics
from offloadlab.store import RunStore


@dataclass(frozen=True)
class StrategySummary:
    name: str
    engine: str
    status: str
    reason: str | None
    steps_done: int
    steps_planned: int
    median_step_time_s: float | None
    tokens_per_s: float | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    host_rss_peak_bytes: int | None
    disk_read_bytes_per_step: float | None
    disk_write_bytes_per_step: float | None
    checkpoint_verified: bool | None
    checkpoint_detail: str | None
    first_loss: float | None
    last_loss: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def _max_or_none(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def summarize(store: RunStore) -> list[StrategySummary]:
    run = store.run()
    out = []
    for row in store.strategies(run["id"]):
        rank0 = store.steps(row["id"], rank=0)
        every_rank = store.steps(row["id"], rank=None)
        steady = metrics.steady_state(rank0)
        median_time = metrics.median([r.step_time_s for r in steady])
        verified = row["checkpoint_verified"]
        out.append(
            StrategySummary(
                name=row["name"],
                engine=row["engine"],
                status=row["status"],
                reason=row["reason"],
                steps_done=len(rank0),
                steps_planned=row["steps_planned"],
                median_step_time_s=median_time,
                tokens_per_s=metrics.median([r.tokens_per_s for r in steady]),
                peak_allocated_bytes=_max_or_none([r.peak_allocated_bytes for r in every_rank]),
                peak_reserved_bytes=_max_or_none([r.peak_reserved_bytes for r in every_rank]),
                host_rss_peak_bytes=_max_or_none([r.host_rss_peak_bytes for r in every_rank]),
                disk_read_bytes_per_step=metrics.median([float(r.disk_read_bytes) for r in steady]),
                disk_write_bytes_per_step=metrics.median([float(r.disk_write_bytes) for r in steady]),
                checkpoint_verified=None if verified is None else bool(verified),
                checkpoint_detail=row["checkpoint_detail"],
                first_loss=rank0[0].loss if rank0 else None,
                last_loss=rank0[-1].loss if rank0 else None,
            )
        )
    return out


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


STATUS_STYLE = {"done": "green", "does_not_fit": "yellow", "failed": "red", "running": "cyan", "pending": "dim"}


def compare_table(run_dir: Path, summaries: list[StrategySummary]) -> Table:
    table = Table(title=f"offloadlab compare {run_dir}", header_style="bold")
    for col in ("strategy", "status", "step (s)", "tokens/s", "GPU peak\nalloc / resv", "host RSS\npeak",
                "disk/step\nread / write", "checkpoint"):
        text = col in ("strategy", "status", "checkpoint")
        table.add_column(col, justify="left" if text else "right", no_wrap=col != "status", overflow="fold")
    for s in summaries:
        status = s.status.replace("_", " ") + ("" if s.status == "done" else f" ({s.steps_done}/{s.steps_planned})")
        if s.reason and s.status != "done":
            status += f": {s.reason}"
        ckpt = {True: "[green]verified[/]", False: "[red]FAILED[/]", None: "-"}[s.checkpoint_verified]
        table.add_row(
            f"{s.name}\n[dim]{s.engine}[/]",
            f"[{STATUS_STYLE.get(s.status, 'white')}]{status}[/]",
            _fmt(s.median_step_time_s, "{:.3f}"),
            _fmt(s.tokens_per_s, "{:,.0f}"),
            f"{human_bytes(s.peak_allocated_bytes)}\n{human_bytes(s.peak_reserved_bytes)}",
            human_bytes(s.host_rss_peak_bytes),
            f"{human_bytes(s.disk_read_bytes_per_step)}\n{human_bytes(s.disk_write_bytes_per_step)}",
            ckpt,
        )
    return table
