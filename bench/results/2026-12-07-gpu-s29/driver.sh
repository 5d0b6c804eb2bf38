#!/usr/bin/env bash
# Run in session 29 on the GPU host, from the checkout's root, after `source .device/setup.sh`.
# Usage: bash bench/results/2026-12-07-gpu-s29/driver.sh RESULTS_DIR
#   torchao at 1.42B with DeepSpeed's CPU Adam and with torch's fused AdamW, beside FSDP2 without offload.
# The other results here ran bench/results/2026-12-07-gpu-s27/driver.sh and bench/results/2026-12-05-gpu-s22/driver.sh.
set -u
[ -d /tmp/hfsite/tomli_w ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/tomli_w-*.whl
[ -d /tmp/hfsite/torchao ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/torchao-*.whl
export PYTHONPATH=$PWD:/tmp/hfsite${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/torch_ext
R=$1; mkdir -p "$R"; S=bench/results/2026-12-07-gpu-s29; : "${W:?source .device/setup.sh first: it sets W}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; date -u; } >> "$R/gpu.txt"
rm -rf "$W/aoopt"
start=$(date +%s)
python3 -m offloadlab.cli run $S/torchao_optimizers.toml --out "$W/aoopt" > "$W/aoopt.log" 2>&1
echo "aoopt rc=$? wall_s=$(( $(date +%s) - start ))" >> "$R/gpu.txt"
tail -30 "$W/aoopt.log" > "$R/aoopt_run_tail.txt"
COLUMNS=200 python3 -m offloadlab.cli compare "$W/aoopt" > "$R/aoopt_compare.txt" 2>&1
python3 -m offloadlab.cli compare "$W/aoopt" --json > "$R/aoopt_compare.json" 2>&1
