"""DeepSpeed's compiled ops (Adam, aio, CPU collectives): built once per venv at setup, afterwards only loaded.

DeepSpeed JIT-builds its ops through torch.utils.cpp_extension on first use. `load_op` is the one place
offloadlab loads one, and it removes the three ways that build hung or repeated itself:
- torch's build lock is a file made with O_EXCL. A build killed part-way leaves it; every later load
  waits on it forever, and once someone deletes it the waiter imports a .so that was never built. Here
  loads are serialized by an flock, which the kernel releases when its holder dies; under it, a torch
  lock file is stale unless a build tool (ninja, a compiler, the linker) runs in that folder, and is
  removed. Any other process working in the folder (a shell, an editor) is no build.
- ninja keeps a hash of each command in .ninja_log, in a format that changed in ninja 1.12: the venv's
  ninja (DeepSpeed's `ninja` dependency, on PATH once the venv is activated) and an older system ninja
  each read the other's log as "every command changed" and rebuild everything. Loads here always run the
  venv's ninja, and the C++ compiler is always `c++` (torch puts $CXX into every command).
- torch's default extensions folder is per user and shared by every venv; the venv's own folder is used,
  so two checkouts never rebuild for each other.
It also asks the CPU's features once: DeepSpeed asks py-cpuinfo three times while it loads cpu_adam, and
py-cpuinfo answers each time from a fresh Python process (3.4 s of an 11 s ZeRO-2 start on the 2-core
CPU machine, paid again by the checkpoint check's restart). The answer is kept beside the ops, under the
CPU's identity, for the next process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ContextManager

import psutil

from offloadlab.checks.host import PreflightError

# Each op's DeepSpeed builder class. An accelerator may lack one (the shared-memory collectives exist
# on the CPU accelerator only, where every DeepSpeed process group loads them): there it is not needed.
BUILDERS = {
    "cpu_adam": "CPUAdamBuilder",
    "fused_adam": "FusedAdamBuilder",
    "async_io": "AsyncIOBuilder",
    "deepspeed_shm_comm": "ShareMemCommBuilder",
}
OPS = tuple(BUILDERS)
BUILD_TIME = {
    "cpu_adam": "about a minute",
    "fused_adam": "about a minute",
    "async_io": "a few minutes",
    "deepspeed_shm_comm": "under a minute",
}
LOCK_FILE = "offloadlab-build.lock"
# What torch's build runs in the build folder: ninja, and the compilers and linker ninja starts.
BUILD_TOOLS = frozenset(
    {"ninja", "c++", "g++", "gcc", "cc", "cc1plus", "cc1", "as", "ld", "collect2", "clang", "clang++", "nvcc", "cicc"}
)
# Said while a load waits for a build it does not own; a rank's goes to its log.
Say = Callable[[str], None]


def _say_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def choose_deepspeed_accelerator() -> None:
    """Before DeepSpeed is first imported: its accelerator is picked once, at import. Its ops build into
    the venv's own folder (see above), whoever loads them first."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if _has_cuda() else "cpu")
    if "TORCH_EXTENSIONS_DIR" not in os.environ and os.access(sys.prefix, os.W_OK):
        # In the environment, so torch and every process started from here (torchrun, the ranks) agree.
        os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(sys.prefix) / "torch_extensions")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# What to show while an op builds; called with the op's name only when a build is about to start.
Announce = Callable[[str], ContextManager]

_loaded: dict[str, object] = {}

# py-cpuinfo's answer, handed by a parent (`ensure_built`) to the ranks it starts.
CPU_INFO_ENV = "OFFLOADLAB_CPU_INFO"


# py-cpuinfo's answer kept beside the built ops, under the CPU's identity: it takes a second a process
# (a fresh Python process of its own), a third of `doctor`.
CPU_INFO_FILE = "cpu_info.json"
_CPU_IDENTITY_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags")


def cpu_identity() -> str | None:
    """What py-cpuinfo's answer depends on, from /proc/cpuinfo (None where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    fields = sorted({line for line in lines if line.split(":")[0].strip() in _CPU_IDENTITY_FIELDS})
    return json.dumps([os.cpu_count(), fields]) if fields else None


def _cached_cpu_info(cache: Path, ask: Callable[[], dict]) -> str:
    """The answer stored in `cache` for this CPU, else ask's, stored there (where it can be written)."""
    identity = cpu_identity()
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        stored = json.loads(cache.read_text())
        if identity is not None and stored["cpu"] == identity and isinstance(stored["info"], dict):
            return json.dumps(stored["info"])
    answer = ask()
    if identity is not None:
        with contextlib.suppress(OSError):
            partial = cache.with_name(f".{cache.name}.{os.getpid()}")
            partial.write_text(json.dumps({"cpu": identity, "info": answer}))
            partial.replace(cache)
    return json.dumps(answer)


@functools.cache
def _cpu_info_json() -> str:
    import cpuinfo

    given = os.environ.get(CPU_INFO_ENV, "")
    with contextlib.suppress(ValueError):
        if isinstance(json.loads(given), dict):
            return given
    return _cached_cpu_info(build_folders("cpu_adam")[0].parent / CPU_INFO_FILE, cpuinfo.get_cpu_info)


def ask_cpu_info_once() -> None:
    """py-cpuinfo's get_cpu_info answers from this process's first ask on (DeepSpeed imports it by name
    at each call, so the module's function is what it finds)."""
    import cpuinfo

    first = _cpu_info_json()
    cpuinfo.get_cpu_info = lambda: json.loads(first)


def build_folders(name: str) -> list[Path]:
    """The folders an op's load builds into (torch's own answer: its default root has a python- and
    CUDA-specific name). async_io loads pin_memory first, which holds the pinned-tensor manager."""
    choose_deepspeed_accelerator()
    from torch.utils.cpp_extension import _get_build_directory

    names = ["pin_memory", name] if name == "async_io" else [name]
    return [Path(_get_build_directory(n, verbose=False)) for n in names]


def _venv_ninja() -> Path:
    import ninja

    return Path(ninja.BIN_DIR) / "ninja"


def on_this_accelerator(name: str) -> bool:
    return _builder(name) is not None


def is_built(name: str) -> bool:
    """True when the op's library exists and ninja has nothing to redo for it (or the accelerator has none)."""
    if not on_this_accelerator(name):
        return True
    for folder in build_folders(name):
        if not (folder / f"{folder.name}.so").is_file() or not (folder / "build.ninja").is_file():
            return False
        dry_run = subprocess.run([str(_venv_ninja()), "-n", "-C", str(folder)], capture_output=True, text=True)
        if dry_run.returncode != 0 or "no work to do" not in dry_run.stdout:
            return False
    return True


@contextlib.contextmanager
def _build_lock(root: Path, say: Say) -> Iterator[None]:
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_NB | fcntl.LOCK_EX)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            say(f"waiting for offloadlab process {holder}, which is building DeepSpeed's ops in {root}")
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if its holder dies, unlike torch's lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)  # who holds it, for the next waiter's message
        yield
    finally:
        os.close(fd)


def _build_tool_in(folder: Path) -> psutil.Process | None:
    """A build tool at work in the folder: torch runs ninja (and ninja the compilers) with the build folder
    as working directory."""
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] not in BUILD_TOOLS:
            continue
        try:
            cwd = Path(proc.cwd())
        except (psutil.Error, FileNotFoundError):
            continue  # gone, or another user's (who builds in their own extensions folder)
        if cwd == folder or folder in cwd.parents:
            return proc
    return None


def _clear_stale_torch_lock(folder: Path, say: Say) -> None:
    """Under the flock no offloadlab process builds, so torch's lock file is either a foreign build's (a
    build tool works in the folder: wait for it, as torch would, and say so) or a dead one's (remove it, so
    the build is redone instead of importing a library that was never finished)."""
    lock = folder / "lock"
    said = False
    while lock.exists() and (builder := _build_tool_in(folder)) is not None:
        if not said:
            say(f"waiting for {builder.info['name']} (PID {builder.pid}), which is building in {folder}")
            said = True
        time.sleep(1)
    lock.unlink(missing_ok=True)


@contextlib.contextmanager
def _pinned_build_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("PATH", "CXX")}
    os.environ["PATH"] = f"{_venv_ninja().parent}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["CXX"] = "c++"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _builder(name: str):
    """DeepSpeed's builder for the op on this accelerator, or None where the accelerator has no such op."""
    choose_deepspeed_accelerator()
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().create_op_builder(BUILDERS[name])


def check_libaio() -> None:
    if not _builder("async_io").is_compatible(verbose=False):
        raise PreflightError(
            "DeepSpeed's async_io op cannot be built: libaio is missing. Install it "
            "(Debian/Ubuntu: apt-get install libaio-dev; RHEL: dnf install libaio-devel), then retry"
        )


def load_op(name: str, announce: Announce | None = None, say: Say = _say_on_stderr):
    """The op's module, built first if needed (with `announce(name)` shown meanwhile, and `say` told of a
    wait for another process's build). DeepSpeed keeps what is loaded here and hands it to its own callers
    in this process, so they never build."""
    if name in _loaded:
        return _loaded[name]
    if not on_this_accelerator(name):
        return None
    ask_cpu_info_once()
    if name == "async_io":
        check_libaio()
    folders = build_folders(name)
    with _build_lock(folders[0].parent, say):
        for folder in folders:
            _clear_stale_torch_lock(folder, say)
        shown = announce(name) if announce is not None and not is_built(name) else contextlib.nullcontext()
        with shown, _pinned_build_env():
            try:
                _loaded[name] = _builder(name).load(verbose=False)
            except (RuntimeError, ImportError, OSError) as err:
                # torch puts the compiler's whole output into the message: keep it in a file, name it here.
                log = folders[-1] / "offloadlab-build-error.log"
                log.write_text(f"{type(err).__name__}: {err}\n")
                first_line = (str(err).strip() or type(err).__name__).splitlines()[0]
                raise PreflightError(
                    f"DeepSpeed's {name} op did not build or load ({first_line}); the compiler's output is in "
                    f"{log}. Run 'offloadlab doctor' and include its output in a bug report"
                ) from err
    return _loaded[name]


def ensure_built(names, announce: Announce | None = None) -> None:
    """Build what is not built yet, without loading what is (a parent process only starts the ranks), and
    give the ranks it starts the CPU's features, asked here once."""
    names = [name for name in dict.fromkeys(names) if on_this_accelerator(name)]
    if names:
        os.environ[CPU_INFO_ENV] = _cpu_info_json()
    for name in names:
        if not is_built(name):
            load_op(name, announce)


def announce_on(console) -> Announce:
    """A spinner on a terminal; one line where output is a log, so the wait is explained there too."""

    def announce(name: str) -> ContextManager:
        message = f"building DeepSpeed's {name} op (first use, {BUILD_TIME[name]})"
        if console.is_terminal:
            return console.status(message)
        console.print(message)
        return contextlib.nullcontext()

    return announce
