#!/usr/bin/env bash
# What ran on the GPU host in session 26, from the checkout's root, after `source .device/setup.sh`.
# Usage: bash bench/results/2026-12-06-gpu-s26/driver.sh RESULTS_DIR autotune64|grid64
#   autotune64: plan, then autotune at 64 x 1024 tokens over the no-offload baseline and the exact offloads
#   grid64: 31 steps each of the autotune's fastest baseline split and its two fastest offloads, from the
#   autotune64 results copied into TRIALS (default: this folder)
set -u
[ -d /tmp/hfsite/tomli_w ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/tomli_w-*.whl
export PYTHONPATH=$PWD:/tmp/hfsite${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/torch_ext
R=$1; mkdir -p "$R"; S=bench/results/2026-12-06-gpu-s26; : "${W:?source .device/setup.sh first: it sets W}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; date -u; } >> "$R/gpu.txt"
timed() { local start=$(date +%s); "$@"; echo "$* rc=$? wall_s=$(( $(date +%s) - start ))" >> "$R/gpu.txt"; }
ONLY=fsdp2,zero1-cpu,zero2-cpu,fsdp2-cpu-offload-dsadam-kept,fsdp2-cpu-offload-dsadam
case $2 in
autotune64)
  python3 -m offloadlab.cli plan $S/spec64.toml > "$R/plan64.txt" 2>&1
  rm -rf "$W/autotune64"
  timed python3 -m offloadlab.cli autotune $S/spec64.toml --budget "${BUDGET:-6m}" --steps 4 --only $ONLY \
    --out "$W/autotune64" > "$R/autotune64.txt" 2>&1
  cp "$W/autotune64/autotune.json" "$R/" 2>/dev/null
  mkdir -p "$R/trial_specs"  # each trial's spec, for grid64 (which may run on a fresh machine)
  for d in "$W"/autotune64/*/; do [ -f "$d/spec.toml" ] && cp "$d/spec.toml" "$R/trial_specs/$(basename "$d").toml"; done ;;
grid64)  # each picked configuration's own trial spec, for 31 steps, in its own run folder
  rm -rf "$W/grid64"
  python3 $S/picks.py "${TRIALS:-$S}/autotune.json" "${TRIALS:-$S}/trial_specs" "$W/grid64" > "$R/picks.txt"
  for spec in "$W"/grid64/*.toml; do
    name=$(basename "$spec" .toml)
    timed python3 -m offloadlab.cli run "$spec" --out "$W/grid64/$name" > "$R/${name}_run.txt" 2>&1
    COLUMNS=200 python3 -m offloadlab.cli compare "$W/grid64/$name" > "$R/${name}_compare.txt" 2>&1
    python3 -m offloadlab.cli compare "$W/grid64/$name" --json > "$R/${name}_compare.json" 2>&1
  done ;;
esac
