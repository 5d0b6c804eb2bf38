#!/usr/bin/env bash
# Session 6's second machine (the first's device time left ~10 minutes): the NVMe pair of driver.sh again,
# the tuned run first (driver.sh ran the default first), 2 steps each, with the first machine's full-tune
# result (at_scale-nvme/work/tune/tuned.toml) instead of a tune of its own.
# Usage: bash bench/results/2026-12-03-h200-s6/driver_reversed.sh RESULTS_DIR
set -u
R=$1; mkdir -p "$R"
step() { echo "$1 $(date +%T)" >> "$R/progress"; }
python3 -c "from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()" > "$R/build_async_io.log" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$R/build_cpu_adam.log" 2>&1 &
wait; step "builds done"
python3 -c "import sys, tomllib, tomli_w; raw = tomllib.loads(open(sys.argv[1]).read())
nvme = next(s for s in raw['strategy'] if s['name'] == 'zero3-nvme')
raw.update(steps=2, verify_checkpoint=False, nvme_path=sys.argv[3],
           strategy=[{**nvme, 'name': 'zero3-nvme-tuned', 'tuned': sys.argv[4]}, nvme])
open(sys.argv[2], 'w').write(tomli_w.dumps(raw))" configs/gpt1.4b_h200.toml "$R/reversed.toml" "$W" \
  "$PWD/bench/results/2026-12-03-h200-s6/at_scale-nvme/work/tune/tuned.toml"
python3 -m offloadlab.cli run "$R/reversed.toml" --out "$W/run-1.4b" > "$R/run.log" 2>&1; step "run rc=$?"
python3 -m offloadlab.cli compare "$W/run-1.4b" > "$R/compare.log" 2>&1
python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d)" \
  "$W/run-1.4b/offloadlab.sqlite" "$R/offloadlab.sqlite"
step "done"
