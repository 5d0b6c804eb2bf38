#!/usr/bin/env bash
# Prepared in session 14 for issue 21's step prediction, not yet run. From the checkout's root after
# `source .device/setup.sh` (which exports W, a work folder on the machine's disk); tomli_w carried in .whl/.
# Usage: bash bench/results/2026-12-04-h200-s13/calibrate.sh OUT
#   `offloadlab plan --json` of the 1.42B comparison (its links: PCIe, CPU Adam, host passes, ZeRO-3's
#   converting upload, block compute) and a run of its six exact strategies, 12 steps each, on the same
#   machine; then bench/plan_accuracy.py's step by phase for that run against those links.
set -u
R=$1; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/tomli_w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tomli_w*.whl
nproc > "$R/cpus.txt"; lscpu | grep -i "model name" >> "$R/cpus.txt"; free -g >> "$R/cpus.txt"
python3 - configs/fastest_offload_h200.toml "$W/calibrate.toml" <<'PY'
import sys, tomllib, tomli_w
spec = tomllib.load(open(sys.argv[1], "rb"))
spec.update(steps=12, name="calibrate-h200")
spec["strategy"] = [s for s in spec["strategy"] if "zenflow" not in s and not s.get("super_offload")]
open(sys.argv[2], "w").write(tomli_w.dumps(spec))
PY
cp "$W/calibrate.toml" "$R/"
python3 -m offloadlab.cli plan "$W/calibrate.toml" --json > "$R/plan.json" 2> "$R/plan.err"
timeout "${T:-480}" python3 -m offloadlab.cli run "$W/calibrate.toml" --plan "$R/plan.json" --out "$W/calibrate" \
  > "$R/run.txt" 2>&1
echo "run rc=$?" >> "$R/run.txt"
python3 bench/plan_accuracy.py "$W/calibrate.toml" --store "$W/calibrate" --links "$R/plan.json" \
  > "$R/accuracy.txt" 2>&1
python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" \
  "$W/calibrate/offloadlab.sqlite"
tar -czf "$R/calibrate.tar.gz" -C "$W" "calibrate"
