"""Measurements of this machine shared by tune and plan: the aio handle bench and plain O_DIRECT, pinned
PCIe copies, Adam and host-pass rates, one block's compute.
May import: checks, engines, results, spec, workload."""
