#!/usr/bin/env bash
# What ran on one GPU in session 20, from the checkout's root, after `source .device/setup.sh`, with
# transformers 5.25 (only the model families used here) in .whl/site and its newer dependencies as wheels
# in .whl (the image's transformers is older). Issue 36: the planner's GPU peak for a Gemma-3-1B-shaped
# model and a Qwen3-MoE of about 1B (random weights), each strategy of bench/hf_gpu_peak.py for 4 steps.
# Usage: bash bench/results/2026-12-05-gpu-s20/driver.sh RESULTS_DIR MODEL [MODEL ...]
set -u
R=$1; shift; mkdir -p "$R"
[ -d /tmp/hfsite/truststore ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/hfsite .whl/*.whl
export PYTHONPATH=$PWD:$PWD/.whl/site:/tmp/hfsite${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$R/gpu.txt"; nproc >> "$R/gpu.txt"
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$R/gpu.txt"
python3 bench/hf_gpu_peak.py write /tmp/hf-models "$W"
for m in "$@"; do
  python3 -m offloadlab.cli plan /tmp/hf-models/$m.toml --json > "$R/plan_$m.json" 2> "$R/plan_$m.err"
  { time python3 -m offloadlab.cli run /tmp/hf-models/$m.toml --out "$W/run_$m"; } > "$R/run_$m.txt" 2>&1
  echo "$m run rc=$?" >> "$R/progress"
  cp "$W/run_$m/offloadlab.sqlite" "$R/$m.sqlite"; tar -czf "$R/logs_$m.tar.gz" -C "$W/run_$m" logs
done
python3 bench/hf_gpu_peak.py table $(for m in "$@"; do echo "$R/plan_$m.json $W/run_$m"; done) > "$R/table.txt" 2>&1
