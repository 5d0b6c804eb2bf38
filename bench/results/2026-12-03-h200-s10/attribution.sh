#!/usr/bin/env bash
# Issue 19 on the H200: what is on the GPU at DeepSpeed's peak for the HF-shaped models.
# Usage (checkout root, after `source .device/setup.sh`): bash bench/results/2026-12-03-h200-s10/attribution.sh OUT
set -u
R=$1; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/transformers ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
python3 bench/hf_gpu_peak.py write /tmp/hf-models "$W"
for m in llama-3.2-1b qwen2.5-1.5b; do
  for s in zero2-cpu zero3-opt-cpu; do
    python3 bench/gpu_peak_attribution.py /tmp/hf-models/$m.toml $s 3 >> "$R/attribution.txt" 2>> "$R/attribution.err"
    echo "$m $s rc=$?" >> "$R/attribution.txt"
  done
done
