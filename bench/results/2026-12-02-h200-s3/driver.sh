#!/usr/bin/env bash
# What ran on the H200 (one GPU) for issues 4 and 7, from the checkout's root, after
# `source .device/setup.sh` (which exports W, a folder on the machine's disk where O_DIRECT works).
# Usage: bash bench/results/2026-12-02-h200-s3/driver.sh RESULTS_DIR
# (When it ran, telemetry_overhead.py measured the sampler thread; it now measures the side process, and
# the thread with --thread.)
set -u
R=$1; mkdir -p "$R"
# DeepSpeed's ops JIT-build on first use; both at once, before anything is timed.
python3 -c "from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()" > "$R/build_async_io.log" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$R/build_cpu_adam.log" 2>&1 &
wait
echo "builds done $(date +%T)" >> "$R/progress"
python3 bench/telemetry_overhead.py configs/overhead_gpu.toml --strategy fsdp2 --blocks 20 --steps-per-block 10 \
  > "$R/telemetry_overhead.log" 2>&1
echo "telemetry overhead rc=$? $(date +%T)" >> "$R/progress"
python3 bench/at_scale.py configs/gpt1.4b_h200.toml --nvme "$W" --results "$R/at_scale" --run-dir "$W/run-1.4b" \
  > "$R/at_scale.log" 2>&1
echo "at_scale rc=$? $(date +%T)" >> "$R/progress"
