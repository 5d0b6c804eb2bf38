#!/usr/bin/env bash
# What ran on the H200 (one GPU) in session 6, from the checkout's root, after `source .device/setup.sh`
# (which exports W, a folder on the machine's disk where O_DIRECT works).
# Usage: bash bench/results/2026-12-03-h200-s6/driver.sh RESULTS_DIR
set -u
R=$1; mkdir -p "$R"
step() { echo "$1 $(date +%T)" >> "$R/progress"; }
# DeepSpeed's ops JIT-build on first use; both at once, before anything is timed.
python3 -c "from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()" > "$R/build_async_io.log" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$R/build_cpu_adam.log" 2>&1 &
wait; step "builds done"
# Issue 6: host rates at a cache-sized probe against one 4x the last-level cache.
python3 bench/host_rates.py > "$R/host_rates.log" 2>&1; step "host_rates rc=$?"
# The 1.42B spec with 4 steps and no checkpoint (restores were verified in sessions 3-5): the step times
# and memory are what this session measures.
python3 -c "import sys, tomllib, tomli_w; raw = tomllib.loads(open(sys.argv[1]).read())
raw.update(steps=4, verify_checkpoint=False); open(sys.argv[2], 'w').write(tomli_w.dumps(raw))" \
  configs/gpt1.4b_h200.toml "$R/gpt1.4b_h200_4steps.toml"
# Issue 6: the planner's step bounds and memory against runs on the machine whose links it measures.
python3 bench/at_scale.py "$R/gpt1.4b_h200_4steps.toml" --nvme "$W" --results "$R/at_scale-ram" --run-dir "$W/run-1.4b" \
  --only zero2-cpu zero3-cpu fsdp2-cpu-offload fsdp2 > "$R/at_scale-ram.log" 2>&1
step "at_scale ram rc=$?"
rm -rf "$W/run-1.4b"
# Issue 7: DeepSpeed's default aio against the full tune's, on the same machine, one after the other.
python3 -c "import sys, tomllib, tomli_w; raw = tomllib.loads(open(sys.argv[1]).read())
raw.update(steps=3, verify_checkpoint=False); open(sys.argv[2], 'w').write(tomli_w.dumps(raw))" \
  configs/gpt1.4b_h200.toml "$R/gpt1.4b_h200_3steps.toml"
python3 bench/at_scale.py "$R/gpt1.4b_h200_3steps.toml" --nvme "$W" --results "$R/at_scale-nvme" --run-dir "$W/run-1.4b" \
  --full-tune --only zero3-nvme zero3-nvme-tuned > "$R/at_scale-nvme.log" 2>&1
step "at_scale nvme rc=$?"
rm -rf "$W/run-1.4b"
