#!/usr/bin/env bash
# What ran on the H200 (one GPU) in session 4, from the checkout's root, after `source .device/setup.sh`
# (which exports W, a folder on the machine's disk where O_DIRECT works).
# Usage: bash bench/results/2026-12-02-h200-s4/driver.sh RESULTS_DIR
set -u
R=$1; mkdir -p "$R"
step() { echo "$1 $(date +%T)" >> "$R/progress"; }
# DeepSpeed's ops JIT-build on first use; both at once, before anything is timed.
python3 -c "from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()" > "$R/build_async_io.log" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$R/build_cpu_adam.log" 2>&1 &
wait; step "builds done"
python3 bench/pinned_rounding.py > "$R/pinned_rounding.log" 2>&1; step "pinned probe rc=$?"
# Issue 7: the strategies session 3 did not reach (its zero3-nvme, default aio, is in ../2026-12-02-h200-s3).
python3 bench/at_scale.py configs/gpt1.4b_h200.toml --nvme "$W" --results "$R/at_scale" --run-dir "$W/run-1.4b" \
  --only zero3-nvme-tuned zero3-cpu zero2-cpu fsdp2-cpu-offload fsdp2 > "$R/at_scale.log" 2>&1
step "at_scale rc=$?"
rm -rf "$W/run-1.4b"
# The largest model the planner says fits, a few real steps with its placement (no checkpoint: it would
# not fit the disk), predicted vs measured.
mkdir -p "$R/largest"
python3 -m offloadlab.cli plan --largest --nvme "$W" --write "$R/largest" > "$R/largest/plan.log" 2>&1; step "plan --largest rc=$?"
SPEC=$(ls "$R"/largest/*.toml | head -1)
python3 -c "import sys, tomllib, tomli_w; from pathlib import Path; p = Path(sys.argv[1]); raw = tomllib.loads(p.read_text())
raw.update(verify_checkpoint=False, steps=3); p.write_text(tomli_w.dumps(raw))" "$SPEC"
python3 bench/plan_accuracy.py "$SPEC" --out "$W/run-largest" --results "$R/largest/accuracy.json" > "$R/largest/accuracy.log" 2>&1
step "largest rc=$?"
cp "$W/run-largest/offloadlab.sqlite" "$R/largest/" 2>/dev/null; cp -r "$W/run-largest/logs" "$R/largest/" 2>/dev/null
