#!/usr/bin/env bash
# What ran on the H200 in session 13, from the checkout's root after `source .device/setup.sh` (which exports
# W, a work folder on the machine's disk). tomli_w is carried in .whl/, matplotlib and its wheels in .mpl/.
# Usage: bash bench/results/2026-12-04-h200-s13/driver.sh OUT G RANK
#   `offloadlab plan --largest --gpu-mem G` on this machine (its JSON kept as OUT/plan_G.json), then the
#   plan's RANK-th fitting placement (1: the winner) run for real under the G GiB budget with `--plan`,
#   14 steps (the first 2 left out as warm-up), no checkpoint check (a 6.9B ZeRO-3 checkpoint does not fit
#   this disk); the run store, its logs and `compare --json` go to OUT.
set -u
R=$1; G=$2; K=$3; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/tomli_w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tomli_w*.whl
[ -d /tmp/mpl/matplotlib ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mpl .mpl/*.whl
export PYTHONPATH=$PYTHONPATH:/tmp/mpl
nproc > "$R/cpus.txt"; lscpu | grep -i "model name" >> "$R/cpus.txt"; free -g >> "$R/cpus.txt"
python3 -c "import torch; print('torch', torch.__version__)" >> "$R/cpus.txt"
[ -s "$R/plan_$G.json" ] || python3 -m offloadlab.cli plan --largest --gpu-mem "$G" --json --write "$W/plan_$G" \
  > "$R/plan_$G.json" 2> "$R/plan_$G.err"
cp "$W/plan_$G"/*.toml "$R/" 2>/dev/null
# The winner's written spec, with the RANK-th fitting placement as its strategy
python3 - "$R/plan_$G.json" "$K" "$W/plan_$G" "$W/spec_${G}_$K.toml" <<'PY'
import glob, json, sys, tomllib, tomli_w
plan, rank, written, out = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3], sys.argv[4]
pick = [x for x in plan["predictions"] if x["fits"]][rank - 1]
spec = tomllib.load(open(glob.glob(f"{written}/*.toml")[0], "rb"))
spec.update(steps=14, verify_checkpoint=False)
spec["model"]["activation_checkpointing"] = pick["activation_checkpointing"]
spec["strategy"] = [{k: v for k, v in pick["placement"].items() if v is not None}]
open(out, "w").write(tomli_w.dumps(spec))
print(pick["strategy"], pick["binding"], pick.get("step_s", pick.get("step_bound_s")))
PY
cp "$W/spec_${G}_$K.toml" "$R/"
T=${T:-400}
timeout "$T" python3 -m offloadlab.cli run "$W/spec_${G}_$K.toml" --gpu-mem "$G" --plan "$R/plan_$G.json" --force \
  --out "$W/run_${G}_$K" > "$R/run_${G}_$K.txt" 2>&1
echo "run rc=$?" >> "$R/run_${G}_$K.txt"
python3 -m offloadlab.cli compare "$W/run_${G}_$K" --json > "$R/compare_${G}_$K.json" 2>&1
python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" \
  "$W/run_${G}_$K/offloadlab.sqlite"
tar -czf "$R/run_${G}_$K.tar.gz" -C "$W" --exclude=checkpoints "run_${G}_$K"
