"""Figures sampled while a strategy trains. `sampler` (NVML, psutil, diskstats; no torch) runs in a
process of its own; `probes` is what a rank reads of itself with torch at each step.
May import: results."""
