"""Host rates the planner measures (CPU Adam, torch AdamW, the host passes) at a cache-sized probe against
a probe of 4x the last-level cache, side by side in one run.

    python bench/host_rates.py

A server CPU's L3 holds a small probe whole, and the rate it reports is the cache's, not the DRAM rate a
step over billions of parameters gets; `offloadlab.links` sizes its probes beyond the cache for this.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from offloadlab.links import beyond_caches, last_level_cache_bytes, measure_adam_params_per_s, measure_host_passes_params_per_s

SMALL = {"DeepSpeed CPU Adam": 8 << 20, "torch AdamW (CPU)": 8 << 20, "host passes": 32 << 20}
BYTES_PER_ELEMENT = {"DeepSpeed CPU Adam": 16, "torch AdamW (CPU)": 16, "host passes": 10}
MEASURE = {"DeepSpeed CPU Adam": lambda n: measure_adam_params_per_s("deepspeed-cpu", numel=n),
           "torch AdamW (CPU)": lambda n: measure_adam_params_per_s("torch", numel=n),
           "host passes": lambda n: measure_host_passes_params_per_s(n)}


def main() -> None:
    llc = last_level_cache_bytes()
    table = Table(title=f"host rates, M params/s (last-level cache {llc / 2**20:.0f} MiB)", header_style="bold")
    for col in ("rate", "small probe", "M params/s", "beyond the cache", "M params/s", "small / beyond"):
        table.add_column(col, justify="left" if col == "rate" else "right")
    for name, small in SMALL.items():
        big = beyond_caches(BYTES_PER_ELEMENT[name], small)
        small_rate, big_rate = MEASURE[name](small), MEASURE[name](big)
        table.add_row(name, f"{small >> 20}M", f"{small_rate / 1e6:.0f}", f"{big >> 20}M", f"{big_rate / 1e6:.0f}",
                      f"{small_rate / big_rate:.2f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
