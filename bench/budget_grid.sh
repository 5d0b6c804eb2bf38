#!/usr/bin/env bash
# bench/budget_grid.py on the lent H200, in calls of a fixed length. From the checkout's root, after
# `source .device/setup.sh` (which exports W, a work folder on the machine's disk); tomli_w is carried in .whl/.
# Usage: T=SECONDS bash bench/budget_grid.sh OUT G [FROM]
#   `offloadlab plan --largest --gpu-mem G` on this machine (kept as OUT/plan_G.json, its written spec as
#   OUT/spec_G.toml), then the grid around that GPT, 3 steps a cell, stopped between cells so that the
#   script ends within T seconds (a cell still running at T is stopped as by Ctrl-C and run again later).
#   Run again on the same machine, it goes on from the cells it settled. FROM, a results folder from an
#   earlier machine (plan_G.json, spec_G.toml, grid_G.tar.gz), puts that grid back in $W first: its plan
#   and settled cells are kept and the rest are run here. OUT gets the grid's table, grid.json, the machine
#   (cpus.txt), and the cells' stores and logs (grid_G.tar.gz).
set -u
R=$1; G=$2; FROM=${3:-}; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -n "$FROM" ] && [ ! -s "$W/plan_$G.json" ]; then
  mkdir -p "$W/plan_$G"; cp "$FROM/plan_$G.json" "$W/"; cp "$FROM/spec_$G.toml" "$W/plan_$G/"
  tar xzf "$FROM/grid_$G.tar.gz" -C "$W"
fi
[ -d /tmp/site/tomli_w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tomli_w*.whl
nproc > "$R/cpus.txt"; lscpu | grep -i "model name" >> "$R/cpus.txt"; free -g >> "$R/cpus.txt"
python3 -c "import torch; print('torch', torch.__version__)" >> "$R/cpus.txt"
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > /dev/null 2>&1
[ -s "$W/plan_$G.json" ] || python3 -m offloadlab.cli plan --largest --gpu-mem "$G" --json --write "$W/plan_$G" \
  > "$W/plan_$G.json" 2> "$R/plan_$G.err"
cp "$W/plan_$G.json" "$R/"; cp "$W/plan_$G"/*.toml "$R/spec_$G.toml"
LEFT=$((${T:-500} - SECONDS))   # the last 20 s are for packing what the grid wrote
timeout -s INT "$LEFT" python3 bench/budget_grid.py --plan "$W/plan_$G.json" --spec "$R/spec_$G.toml" \
  --gpu-mem "$G" --steps 3 --stop-by "$((LEFT - 20))" --out "$W/grid_$G" > "$R/grid_$G.txt" 2>&1
echo "grid rc=$?" >> "$R/grid_$G.txt"
for s in "$W/grid_$G"/*/offloadlab.sqlite; do
  python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$s"
done
cp "$W/grid_$G/grid.json" "$R/" 2>/dev/null
# The logs name this machine's folders: write them as $W and $VENV
V=$(python3 -c "import sys; print(sys.prefix)")
find "$W/grid_$G" "$R" -name "*.log" -o -name "*.txt" -o -name "*.toml" -o -name "*.err" | xargs sed -i "s#$W#\$W#g; s#$V#\$VENV#g"
tar -czf "$R/grid_$G.tar.gz" -C "$W" --exclude=checkpoints "grid_$G"
