"""`offloadlab doctor`: what this machine and venv can do, for the user and for bug reports.

Each check is one `Finding`, gathered independently: one that cannot be answered says why and the others
still run (as nvitop reads each NVML field on its own).
"""

from __future__ import annotations

import platform
import shutil
import time
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil

from offloadlab.checks.host import PreflightError

GiB = 2**30


@dataclass(frozen=True)
class Finding:
    check: str
    value: str
    ok: bool | None = None
    """True fine, False a problem (`fix` says what to do), None only information."""
    fix: str = ""


def _package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def versions() -> list[Finding]:
    import torch

    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    found = [
        Finding("python", f"{platform.python_version()} ({platform.machine()})"),
        Finding("torch", f"{torch.__version__} ({cuda}; GPU available: {torch.cuda.is_available()})"),
        Finding(
            "deepspeed",
            _package("deepspeed"),
            _package("deepspeed") != "not installed",
            "install it after torch: pip install --no-build-isolation deepspeed==0.19.8",
        ),
    ]
    return found + [Finding(name, _package(name)) for name in ("transformers", "textual", "nvidia-ml-py")]


def op_findings(build: bool, announce=None) -> list[Finding]:
    """Whether each DeepSpeed op is built and loads (loading one that is built takes a few seconds)."""
    from offloadlab.engines import ops

    found = []
    for name in ops.OPS:
        try:
            if not ops.on_this_accelerator(name):
                found.append(Finding(f"op {name}", "not used on this accelerator"))
                continue
            if not build and not ops.is_built(name):
                found.append(
                    Finding(
                        f"op {name}",
                        "not built",
                        False,
                        "run 'offloadlab doctor --build' (make setup does): it builds once, minutes",
                    )
                )
                continue
            start = time.perf_counter()
            ops.load_op(name, announce)
            found.append(Finding(f"op {name}", f"built, loads ({time.perf_counter() - start:.1f} s)", True))
        except (PreflightError, ImportError) as err:
            found.append(Finding(f"op {name}", "does not build or load", False, str(err)))
    folder = ops.build_folders("cpu_adam")[0].parent
    shown = folder.relative_to(Path.cwd()) if folder.is_relative_to(Path.cwd()) else folder  # short, pasteable
    return found + [Finding("ops folder", str(shown))]


def libaio() -> Finding:
    from offloadlab.engines.ops import check_libaio

    try:
        check_libaio()
    except PreflightError as err:
        return Finding("libaio", "missing", False, str(err))
    return Finding("libaio", "found (async_io can build)", True)


def aio_event_headroom() -> Finding:
    from offloadlab.checks.host import aio_events

    events = aio_events()
    if events is None:
        return Finding("fs.aio-max-nr", "unreadable (/proc/sys/fs)")
    used, limit = events
    # The tuner's largest point and a ZeRO-3 NVMe run's handles each reserve a few thousand events.
    free = limit - used
    return Finding(
        "fs.aio-max-nr", f"{free:,} of {limit:,} events free", free >= 4096, f"sysctl -w fs.aio-max-nr={limit * 2}"
    )


def pinned_memory() -> list[Finding]:
    from offloadlab.checks.host import has_cap_ipc_lock, memlock_limit_bytes, pinned_memory_budget_bytes

    limit = memlock_limit_bytes()
    if limit is None:
        why = "CAP_IPC_LOCK" if has_cap_ipc_lock() else "unlimited"
        memlock = Finding("ulimit -l", f"no limit ({why})", True)
    else:
        memlock = Finding(
            "ulimit -l",
            f"{limit // 1024:,} KiB",
            limit >= GiB,
            "ulimit -l unlimited (or memlock in /etc/security/limits.conf; Docker: --ulimit memlock=-1)",
        )
    budget = pinned_memory_budget_bytes()
    return [
        memlock,
        Finding("pinned-memory budget", f"{budget / GiB:.1f} GiB (80% of available RAM, within ulimit -l)"),
    ]


def gpus() -> list[Finding]:
    from offloadlab.telemetry.sampler import NvmlReader

    reader, why_not = NvmlReader.open()
    if reader is None:
        return [Finding("GPUs (NVML)", f"none: {(why_not or '').removeprefix('GPU fields absent: ')}")]
    nv = reader.nvml
    found = [Finding("NVIDIA driver", nv.nvmlSystemGetDriverVersion())]
    for index, handle in enumerate(reader.handles):
        memory = nv.nvmlDeviceGetMemoryInfo(handle)
        found.append(
            Finding(
                f"GPU {index}",
                f"{nv.nvmlDeviceGetName(handle)}, {memory.total / GiB:.1f} GiB ({memory.free / GiB:.1f} free)",
            )
        )
    return found


def host_and_disk(nvme_path: Path | None) -> list[Finding]:
    from offloadlab.checks.host import check_direct_io, filesystem_type

    memory = psutil.virtual_memory()
    found = [
        Finding("CPU cores", f"{psutil.cpu_count(logical=False)} physical, {psutil.cpu_count()} logical"),
        Finding("RAM", f"{memory.available / GiB:.1f} of {memory.total / GiB:.1f} GiB available"),
    ]
    if nvme_path is None:
        return found + [Finding("NVMe path", "not given (--nvme PATH)")]
    if not nvme_path.is_dir():
        return found + [Finding("NVMe path", f"{nvme_path} is not a folder", False, "pass a folder on the NVMe drive")]
    try:
        check_direct_io(nvme_path, "NVMe path")
        direct = Finding("O_DIRECT", f"works on {nvme_path} ({filesystem_type(nvme_path)})", True)
    except PreflightError as err:
        direct = Finding("O_DIRECT", "fails", False, str(err))
    free = shutil.disk_usage(nvme_path).free
    return found + [Finding("NVMe free", f"{free / GiB:.1f} GiB at {nvme_path}"), direct]


def diagnose(nvme_path: Path | None, build: bool, announce=None) -> list[Finding]:
    return [
        *versions(),
        *op_findings(build, announce),
        libaio(),
        aio_event_headroom(),
        *pinned_memory(),
        *gpus(),
        *host_and_disk(nvme_path),
    ]


def as_json(findings: list[Finding]) -> list[dict]:
    return [asdict(f) for f in findings]


def findings_table(findings: list[Finding]):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="offloadlab doctor", show_lines=False)
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("found", overflow="fold")
    for f in findings:
        mark = {True: "[green]ok[/]", False: "[red]![/]", None: ""}[f.ok]
        value = escape(f.value) + (f"\n[yellow]fix: {escape(f.fix)}[/]" if f.ok is False and f.fix else "")
        table.add_row(f.check, mark, value)
    return table
