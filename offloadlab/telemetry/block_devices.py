"""Which block devices sit behind a path, and their I/O counters, from sysfs and /proc/diskstats.

The device a path's filesystem lives on is what an offload's bytes cross: a partition (counted on its own
in diskstats), or a RAID (md) / device-mapper volume whose members are listed under `slaves/`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYS_BLOCK = Path("/sys/dev/block")
DISKSTATS = Path("/proc/diskstats")
SECTOR_BYTES = 512  # diskstats counts 512-byte sectors whatever the device's sector size


@dataclass(frozen=True)
class BlockDevices:
    primary: str
    """The device the filesystem is on (e.g. nvme0n1p2, md0, vda)."""
    members: tuple[str, ...]
    """What it is built from: a partition's disk, or an md/dm volume's member devices (their disks)."""


@dataclass(frozen=True)
class DiskCounters:
    reads: int
    read_bytes: int
    writes: int
    write_bytes: int


def resolve_block_devices(path: Path, sys_block: Path = SYS_BLOCK) -> BlockDevices | None:
    """None when the path is not on a local block device (tmpfs, NFS, overlay without a device)."""
    st = os.stat(path)
    node = sys_block / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    if not node.exists():
        return None
    real = node.resolve()
    return BlockDevices(primary=real.name, members=tuple(sorted(_members(real))))


def _members(device: Path) -> set[str]:
    if (device / "partition").exists():
        return {device.parent.name}
    slaves = device / "slaves"
    names = set()
    if slaves.is_dir():
        for slave in slaves.iterdir():
            names.add(slave.name)
            names |= _members(slave.resolve())
    return names


def read_diskstats(path: Path = DISKSTATS) -> dict[str, DiskCounters]:
    out = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) < 10:
            continue
        out[fields[2]] = DiskCounters(
            reads=int(fields[3]),
            read_bytes=int(fields[5]) * SECTOR_BYTES,
            writes=int(fields[7]),
            write_bytes=int(fields[9]) * SECTOR_BYTES,
        )
    return out
