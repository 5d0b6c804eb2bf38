#!/usr/bin/env bash
# What ran on the H200 (one GPU) in session 9, from the checkout's root, after `source .device/setup.sh`,
# with transformers and its dependencies carried as cp312 wheels in .whl/ (the GPU image has none).
# Issue 19: the planner's GPU peak for Llama-3.2-1B- and Qwen2.5-1.5B-shaped models (random weights).
# Usage: bash bench/results/2026-12-03-h200-s9/driver.sh RESULTS_DIR MODEL [MODEL ...]
set -u
R=$1; shift; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/transformers ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
python3 bench/hf_gpu_peak.py write /tmp/hf-models "$W"
for m in "$@"; do
  { time python3 -m offloadlab.cli plan /tmp/hf-models/$m.toml --json; } > "$R/plan_$m.json" 2> "$R/plan_$m.err"
  echo "$m plan rc=$?" >> "$R/progress"
  { time python3 -m offloadlab.cli run /tmp/hf-models/$m.toml --out "$W/run_$m"; } > "$R/run_$m.txt" 2>&1
  echo "$m run rc=$?" >> "$R/progress"
  cp -r "$W/run_$m" "$R/run_$m" && rm -rf "$R/run_$m/logs" && tar -czf "$R/logs_$m.tar.gz" -C "$W/run_$m" logs
done
