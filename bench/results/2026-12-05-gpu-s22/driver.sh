#!/usr/bin/env bash
# What ran on the GPU host in session 22, from the checkout's root, after `source .device/setup.sh`.
# Usage: bash bench/results/2026-12-05-gpu-s22/driver.sh RESULTS_DIR autotune|grid
set -u
# The GPU image lacks tomli_w (runs write their spec back): its wheel is carried in .whl, out of git.
[ -d /tmp/hfsite/tomli_w ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/tomli_w-*.whl
export PYTHONPATH=$PWD:/tmp/hfsite${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/torch_ext
R=$1; mkdir -p "$R"; S=bench/results/2026-12-05-gpu-s22; : "${W:?source .device/setup.sh first: it sets W}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; date -u; } >> "$R/gpu.txt"
ONLY=${ONLY:-zero2-cpu,zero1-cpu,fsdp2-cpu-offload-dsadam,zero2-cpu-bf16master,zero2-cpu-zenflow}
case $2 in
autotune)
  rm -rf "$W/autotune"
  start=$(date +%s)
  python3 -m offloadlab.cli autotune $S/spec.toml --budget "${BUDGET:-8m}" --steps 6 --only $ONLY \
    --out "$W/autotune" > "$R/autotune.txt" 2>&1
  echo "autotune rc=$? wall_s=$(( $(date +%s) - start ))" >> "$R/gpu.txt"
  cp "$W/autotune/autotune.json" "$R/" 2>/dev/null; cp -r "$W/autotune"/best-* "$R/" 2>/dev/null ;;
grid)
  rm -rf "$W/grid"
  start=$(date +%s)
  python3 -m offloadlab.cli run $S/grid.toml --out "$W/grid" > "$R/grid_run.txt" 2>&1
  echo "grid rc=$? wall_s=$(( $(date +%s) - start ))" >> "$R/gpu.txt"
  COLUMNS=200 python3 -m offloadlab.cli compare "$W/grid" > "$R/grid_compare.txt" 2>&1
  python3 -m offloadlab.cli compare "$W/grid" --json > "$R/grid_compare.json" 2>&1 ;;
esac
