#!/usr/bin/env bash
# What ran on the H200 (one GPU) in session 5, from the checkout's root, after `source .device/setup.sh`
# (which exports W, a folder on the machine's disk where O_DIRECT works).
# Usage: bash bench/results/2026-12-03-h200-s5/driver.sh RESULTS_DIR
set -u
R=$1; mkdir -p "$R"
step() { echo "$1 $(date +%T)" >> "$R/progress"; }
# DeepSpeed's ops JIT-build on first use; both at once, before anything is timed.
python3 -c "from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()" > "$R/build_async_io.log" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$R/build_cpu_adam.log" 2>&1 &
wait; step "builds done"
# Issue 6: this machine's links as the planner measures them (block compute, host passes, PCIe, CPU Adam).
python3 -m offloadlab.cli plan configs/gpt1.4b_h200.toml --nvme "$W" --json > "$R/plan_1.4b.json" 2> "$R/plan_1.4b.err"
step "plan rc=$?"
# Issue 7: the one strategy session 4 did not reach.
python3 bench/at_scale.py configs/gpt1.4b_h200.toml --nvme "$W" --results "$R/at_scale" --run-dir "$W/run-1.4b" \
  --only fsdp2 > "$R/at_scale.log" 2>&1
step "at_scale rc=$?"
rm -rf "$W/run-1.4b"
# Issue 3: our tuner against ds_nvme_tune on this disk; ds_nvme_tune is stopped after 8 minutes (its full
# grid takes ~29 minutes here, beyond one session's device time).
python3 bench/tune_vs_ds_nvme_tune.py --nvme "$W" --ds-timeout 480 --results "$R/tune_vs_ds_nvme_tune.json" \
  > "$R/tune_vs_ds_nvme_tune.log" 2>&1
step "tune_vs_ds rc=$?"
