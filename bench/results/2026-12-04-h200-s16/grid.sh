#!/usr/bin/env bash
# What ran on the H200 in session 16, from the checkout's root after `source .device/setup.sh` (which exports
# W, a work folder on the machine's disk). tomli_w is carried in .whl/.
# Usage: T=SECONDS bash bench/results/2026-12-04-h200-s16/grid.sh OUT G
#   `offloadlab plan --largest --gpu-mem G` on this machine (kept as OUT/plan_G.json, its written spec as
#   OUT/spec_G.toml), then bench/budget_grid.py's grid around that GPT, 3 steps a cell, stopped as by Ctrl-C
#   when the script has run T seconds. Run again on the same machine (or with OUT's grid.json put back in $W/grid_G), it goes
#   on from the cells it settled. OUT gets the grid's table, grid.json, and its cells' stores and logs.
set -u
R=$1; G=$2; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/tomli_w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tomli_w*.whl
nproc > "$R/cpus.txt"; lscpu | grep -i "model name" >> "$R/cpus.txt"; free -g >> "$R/cpus.txt"
python3 -c "import torch; print('torch', torch.__version__)" >> "$R/cpus.txt"
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > /dev/null 2>&1
[ -s "$W/plan_$G.json" ] || python3 -m offloadlab.cli plan --largest --gpu-mem "$G" --json --write "$W/plan_$G" \
  > "$W/plan_$G.json" 2> "$R/plan_$G.err"
cp "$W/plan_$G.json" "$R/"; cp "$W/plan_$G"/*.toml "$R/spec_$G.toml"
timeout -s INT "$((${T:-500} - SECONDS))" python3 bench/budget_grid.py --plan "$W/plan_$G.json" --spec "$R/spec_$G.toml" \
  --gpu-mem "$G" --steps 3 --out "$W/grid_$G" > "$R/grid_$G.txt" 2>&1
echo "grid rc=$?" >> "$R/grid_$G.txt"
for s in "$W/grid_$G"/*/offloadlab.sqlite; do
  python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$s"
done
cp "$W/grid_$G/grid.json" "$R/" 2>/dev/null
# The logs name this machine's folders: write them as $W and $VENV
V=$(python3 -c "import sys; print(sys.prefix)")
find "$W/grid_$G" "$R" -name "*.log" -o -name "*.txt" -o -name "*.toml" -o -name "*.err" | xargs sed -i "s#$W#\$W#g; s#$V#\$VENV#g"
tar -czf "$R/grid_$G.tar.gz" -C "$W" --exclude=checkpoints "grid_$G"
