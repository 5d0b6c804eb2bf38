"""The sampler: records GPU (NVML), host (psutil) and disk (diskstats) figures into the run store while a
strategy trains, on the same clock (time.time) as step and phase events.

`SamplerProcess` starts the sampling loop (`Sampler`, on a thread) in a process of its own: a thread in
the training process would share its GIL (psutil, /proc reads and SQLite inserts are Python) with a
training loop that is often launch-bound. On an H200 (bench/results/2026-12-02-h200-s3, launch-bound FSDP2
step, ±6% from block to block) a thread there cost +7.0% over 10 sampled blocks, the side process +0.3%.
NVML's PCIe throughput getter blocks ~20 ms per call wherever it runs.
Each NVML getter is read on its own: a field the GPU does not support is recorded as absent, never the
whole sample.

    python -m offloadlab.telemetry.sampler --run-dir D --strategy-id N --hz 10 [--nvme-path P] [--root-pid PID]
samples until its stdin closes (the parent exits or says stop) or it gets SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import psutil

from offloadlab.results.steps import TELEMETRY_NOTE, StepFigures
from offloadlab.results.store import RunStore
from offloadlab.telemetry.block_devices import BlockDevices, read_diskstats, resolve_block_devices

GPU_FIELDS = ("util(%)", "mem_used(B)", "pcie_tx(B/s)", "pcie_rx(B/s)", "power(W)", "temp(C)")


class GpuReader(Protocol):
    def read(self) -> list[dict[str, float | None]]:
        """One dict per GPU, keyed by GPU_FIELDS; a value the GPU cannot give is None."""


class NvmlReader:
    def __init__(self, pynvml, handles: list):
        self.nvml, self.handles = pynvml, handles

    @classmethod
    def open(cls) -> tuple["NvmlReader | None", str | None]:
        """(reader, None), or (None, why GPU fields will be absent)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as err:  # noqa: BLE001 - any NVML failure means the same: no GPU fields
            return None, f"GPU fields absent: NVML unavailable ({type(err).__name__}: {err})"
        if not handles:
            return None, "GPU fields absent: NVML reports no GPUs"
        return cls(pynvml, handles), None

    def _field(self, getter: Callable[[], float]) -> float | None:
        try:
            return float(getter())
        except self.nvml.NVMLError:
            return None

    def read(self) -> list[dict[str, float | None]]:
        nv = self.nvml
        out = []
        for h in self.handles:
            out.append(
                {
                    "util(%)": self._field(lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                    "mem_used(B)": self._field(lambda: nv.nvmlDeviceGetMemoryInfo(h).used),
                    "pcie_tx(B/s)": self._field(
                        lambda: 1024 * nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)
                    ),
                    "pcie_rx(B/s)": self._field(
                        lambda: 1024 * nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES)
                    ),
                    "power(W)": self._field(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    "temp(C)": self._field(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                }
            )
        return out


@dataclass
class _DiskState:
    devices: BlockDevices
    last: dict
    t: float


class Sampler:
    """The sampling loop of `SamplerProcess`'s child (`with Sampler(...)`); it flushes samples to the store
    in batches. This process only samples: its own RSS is not counted as the training's."""

    def __init__(
        self,
        run_dir: Path,
        strategy_id: int,
        hz: float = 10.0,
        nvme_path: Path | None = None,
        root_pid: int | None = None,
        gpu_reader: GpuReader | None | str = "nvml",
        flush_every_s: float = 1.0,
    ):
        self.run_dir, self.strategy_id, self.period = run_dir, strategy_id, 1.0 / hz
        self.root = psutil.Process(root_pid or os.getpid())
        self.flush_every_s = flush_every_s
        self.notes: list[str] = []
        if gpu_reader == "nvml":
            gpu_reader, note = NvmlReader.open()
            if note:
                self.notes.append(note)
        self.gpu = gpu_reader
        devices = resolve_block_devices(nvme_path) if nvme_path else None
        if nvme_path and devices is None:
            self.notes.append(f"disk fields absent: {nvme_path} is not on a local block device")
        self.disk = _DiskState(devices, read_diskstats(), time.time()) if devices else None
        self.samples_taken = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="offloadlab-sampler", daemon=True)

    def __enter__(self) -> "Sampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        psutil.cpu_percent(interval=None)  # the first call only sets the baseline
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        store = RunStore(self.run_dir, writable=True)
        store.add_events(self.strategy_id, None, [(None, TELEMETRY_NOTE, time.time(), None, n) for n in self.notes])
        steps = StepFigures(self.strategy_id)
        pending: list[tuple] = []
        last_flush = time.time()
        next_at = time.time()
        while not self._stop.is_set():
            pending += self.sample()
            now = time.time()
            if now - last_flush >= self.flush_every_s:
                store.add_samples(self.strategy_id, pending)
                steps.store_final(store, strategy_finished=False)
                pending, last_flush = [], now
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.time()))
        pending += self.sample()
        store.add_samples(self.strategy_id, pending)
        steps.store_final(store, strategy_finished=True)
        store.close()

    def sample(self) -> list[tuple[float, str, str, float | None]]:
        t = time.time()
        rows = self._host(t) + self._disk(t)
        if self.gpu is not None:
            for index, fields in enumerate(self.gpu.read()):
                rows += [(t, "gpu", f"gpu{index}.{name}", fields.get(name)) for name in GPU_FIELDS]
        self.samples_taken += 1
        return rows

    def _host(self, t: float) -> list[tuple]:
        rss = 0
        for proc in [self.root, *self.root.children(recursive=True)]:
            if proc.pid == os.getpid():
                continue
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                continue  # a child that just exited
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        return [
            (t, "host", "host.cpu(%)", psutil.cpu_percent(interval=None)),
            (t, "host", "host.rss_tree(B)", float(rss)),
            (t, "host", "host.available(B)", float(memory.available)),
            (t, "host", "host.swap_used(B)", float(swap.used)),
        ]

    def _disk(self, t: float) -> list[tuple]:
        if self.disk is None:
            return []
        now = read_diskstats()
        dt = max(t - self.disk.t, 1e-6)
        rows = []
        for name in (self.disk.devices.primary, *self.disk.devices.members):
            before, after = self.disk.last.get(name), now.get(name)
            if before is None or after is None:
                continue
            prefix = "disk" if name == self.disk.devices.primary else f"disk.{name}"
            read, written = after.read_bytes - before.read_bytes, after.write_bytes - before.write_bytes
            rows += [
                (t, "disk", f"{prefix}.read_bytes(B)", float(read)),
                (t, "disk", f"{prefix}.write_bytes(B)", float(written)),
                (t, "disk", f"{prefix}.read(B/s)", read / dt),
                (t, "disk", f"{prefix}.write(B/s)", written / dt),
                (t, "disk", f"{prefix}.read_iops", (after.reads - before.reads) / dt),
                (t, "disk", f"{prefix}.write_iops", (after.writes - before.writes) / dt),
            ]
        self.disk.last, self.disk.t = now, t
        return rows


READY = "sampling"


class SamplerProcess:
    """`Sampler` in a child process (`with SamplerProcess(...)`): nothing it does takes the trainer's GIL."""

    def __init__(
        self,
        run_dir: Path,
        strategy_id: int,
        hz: float = 10.0,
        nvme_path: Path | None = None,
        root_pid: int | None = None,
    ):
        # -P: the current folder is not searched, so no `offloadlab/` there is imported instead of ours.
        self.cmd = [
            sys.executable,
            "-P",
            "-m",
            "offloadlab.telemetry.sampler",
            "--run-dir",
            str(run_dir),
            "--strategy-id",
            str(strategy_id),
            "--hz",
            str(hz),
            "--root-pid",
            str(root_pid or os.getpid()),
        ]
        if nvme_path is not None:
            self.cmd += ["--nvme-path", str(nvme_path)]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "SamplerProcess":
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        # Back once the child samples: what follows (an engine build, a timed block) is covered from its start.
        if self.proc.stdout.readline().strip() != READY:
            self.proc.wait()
            raise RuntimeError(f"the telemetry sampler exited with code {self.proc.returncode} before sampling")
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()  # its last samples are flushed before it exits
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m offloadlab.telemetry.sampler")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--strategy-id", type=int, required=True)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--nvme-path", type=Path)
    parser.add_argument("--root-pid", type=int)
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole job; the sampler stops when its parent does, through stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leaves the `with`: the sampler flushes
    with Sampler(args.run_dir, args.strategy_id, hz=args.hz, nvme_path=args.nvme_path, root_pid=args.root_pid):
        print(READY, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
