#!/usr/bin/env bash
# Session 15 (issue 21): one layer past `plan --largest --gpu-mem G`'s pick, run for real under the budget to
# see that it does not fit, and on what. From the checkout's root after `source .device/setup.sh`.
# Usage: bash bench/results/2026-12-04-h200-s15/past.sh IN OUT G [BUDGET...]
#   IN holds plan_G.json and spec_G_1.toml from `bench/results/2026-12-04-h200-s13/driver.sh IN G 1` (the
#   plan's JSON names the size one layer up in "one_more_layer"); the same spec with that many layers is run
#   with --force (the plan says it does not fit) under each BUDGET GiB (default G), and each run's output,
#   store and `compare --json` go to OUT.
set -u
I=$1; R=$2; G=$3; shift 3; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/tomli_w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tomli_w*.whl
python3 - "$I/plan_$G.json" "$I/spec_${G}_1.toml" "$R/spec_${G}_past.toml" <<'PY'
import json, sys, tomllib, tomli_w
plan, spec = json.load(open(sys.argv[1])), tomllib.load(open(sys.argv[2], "rb"))
past = plan["one_more_layer"]
spec["model"]["n_layers"] = past["shape"]["n_layers"]
spec["name"] += "-past"
open(sys.argv[3], "w").write(tomli_w.dumps(spec))
print(spec["strategy"][0]["name"], "at", past["shape"]["n_layers"], "layers:", past["bindings"][spec["strategy"][0]["name"]])
PY
for B in "${@:-$G}"; do
  timeout "${T:-300}" python3 -m offloadlab.cli run "$R/spec_${G}_past.toml" --gpu-mem "$B" --force \
    --out "$W/past_$B" > "$R/run_past_$B.txt" 2>&1
  echo "run rc=$?" >> "$R/run_past_$B.txt"
  dmesg 2>/dev/null | grep -i "out of memory\|killed process" | tail -3 >> "$R/run_past_$B.txt"
  python3 -m offloadlab.cli compare "$W/past_$B" --json > "$R/compare_past_$B.json" 2>&1
  python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" \
    "$W/past_$B/offloadlab.sqlite"
  tar -czf "$R/past_$B.tar.gz" -C "$W" --exclude=checkpoints "past_$B"
done
