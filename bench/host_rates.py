"""Host rates the planner measures (CPU Adam, torch AdamW, the host passes) at a cache-sized probe against
a probe of 4x the last-level cache, side by side in one run.

    python bench/host_rates.py

A server CPU's L3 can hold a small probe whole and report the cache's rate, not the DRAM rate a step over
billions of parameters gets; `offloadlab.measure.links` sizes its probes beyond the cache for this.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from offloadlab.measure.links import (
    ADAM_PROBE,
    HOST_PASSES_PROBE,
    last_level_cache_bytes,
    measure_adam_params_per_s,
    measure_host_passes_params_per_s,
)

# name -> (probe, rate at n elements); the small probe is each one's floor, the size used before.
RATES = {
    "DeepSpeed CPU Adam": (ADAM_PROBE, lambda n: measure_adam_params_per_s("deepspeed-cpu", numel=n)),
    "torch AdamW (CPU)": (ADAM_PROBE, lambda n: measure_adam_params_per_s("torch", numel=n)),
    "host passes": (HOST_PASSES_PROBE, lambda n: measure_host_passes_params_per_s(n)),
}


def main() -> None:
    llc = last_level_cache_bytes()
    table = Table(title=f"host rates, M params/s (last-level cache {llc / 2**20:.0f} MiB)", header_style="bold")
    for col in ("rate", "small probe", "M params/s", "beyond the cache", "M params/s", "small / beyond"):
        table.add_column(col, justify="left" if col == "rate" else "right")
    for name, (probe, measure) in RATES.items():
        small, big = probe.min_numel, probe.numel()
        small_rate, big_rate = measure(small), measure(big)
        table.add_row(
            name,
            f"{small >> 20}M",
            f"{small_rate / 1e6:.0f}",
            f"{big >> 20}M",
            f"{big_rate / 1e6:.0f}",
            f"{small_rate / big_rate:.2f}",
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
