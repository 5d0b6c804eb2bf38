#!/usr/bin/env bash
# What ran on the GPU host in session 27, from the checkout's root, after `source .device/setup.sh`.
# Usage: bash bench/results/2026-12-07-gpu-s27/driver.sh RESULTS_DIR torchao|check
#   torchao: torchao's CPUOffloadOptimizer, first a 125M run with its checkpoint restored and checked, then
#   at 1.42B beside FSDP2 without offload and ZeRO-1's CPU offload, 31 steps each
#   check: only the 125M run (about 2 minutes)
# The grid and autotune of grid6/ and autotune/ ran bench/results/2026-12-05-gpu-s22/driver.sh.
set -u
# The GPU image lacks tomli_w and torchao: their wheels are carried in .whl, out of git.
[ -d /tmp/hfsite/tomli_w ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/tomli_w-*.whl
[ -d /tmp/hfsite/torchao ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/torchao-*.whl
export PYTHONPATH=$PWD:/tmp/hfsite${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/torch_ext
R=$1; mkdir -p "$R"; S=bench/results/2026-12-07-gpu-s27; : "${W:?source .device/setup.sh first: it sets W}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; date -u; } >> "$R/gpu.txt"
timed() { local start=$(date +%s); "$@"; echo "$* rc=$? wall_s=$(( $(date +%s) - start ))" >> "$R/gpu.txt"; }
run() {  # run NAME SPEC: the run's last lines and its comparison table come back
  rm -rf "$W/$1"
  timed python3 -m offloadlab.cli run "$2" --out "$W/$1" > "$W/$1.log" 2>&1
  tail -40 "$W/$1.log" > "$R/$1_run_tail.txt"
  COLUMNS=200 python3 -m offloadlab.cli compare "$W/$1" > "$R/$1_compare.txt" 2>&1
}
case $2 in
check)
  run check $S/torchao_check.toml ;;
torchao)
  run check $S/torchao_check.toml
  run ao14 $S/torchao14.toml
  python3 -m offloadlab.cli compare "$W/ao14" --json > "$R/ao14_compare.json" 2>&1 ;;
ao14)
  run ao14 $S/torchao14.toml
  python3 -m offloadlab.cli compare "$W/ao14" --json > "$R/ao14_compare.json" 2>&1 ;;
esac
