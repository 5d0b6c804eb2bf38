#!/usr/bin/env bash
# What ran on the GPU host in session 21, from the checkout's root, after `source .device/setup.sh`.
# Usage: bash bench/results/2026-12-05-h200-s21/driver.sh RESULTS_DIR
set -u
# The GPU image lacks tomli_w (the run writes its spec back): its wheel is carried in .whl, out of git.
[ -d /tmp/hfsite/tomli_w ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/tomli_w-*.whl
export PYTHONPATH=$PWD:/tmp/hfsite${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/torch_ext
R=$1; mkdir -p "$R"; S=bench/results/2026-12-05-h200-s21; : "${W:?source .device/setup.sh first: it sets W}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"; } > "$R/gpu.txt"
rm -rf "$W/run"  # a warm machine keeps an earlier attempt
python3 -m offloadlab.cli run $S/spec.toml --out "$W/run" > "$R/run.txt" 2>&1; echo "run rc=$?" >> "$R/gpu.txt"
COLUMNS=200 python3 -m offloadlab.cli compare "$W/run" > "$R/compare.txt" 2>&1
python3 -m offloadlab.cli compare "$W/run" --json > "$R/compare.json" 2>&1
cp "$W/run/offloadlab.sqlite" "$R/run.sqlite"
