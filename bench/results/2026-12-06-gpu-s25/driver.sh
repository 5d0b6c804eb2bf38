#!/usr/bin/env bash
# What ran on the GPU host in session 25, from the checkout's root, after `source .device/setup.sh`.
# Usage: bash bench/results/2026-12-06-gpu-s25/driver.sh RESULTS_DIR [fsdp2|autotune]   (fsdp2/, autotune/)
# grid6/ ran bench/results/2026-12-05-gpu-s22/driver.sh RESULTS_DIR grid, then the same with autotune and BUDGET=117s.
set -u
[ -d /tmp/hfsite/tomli_w ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/tomli_w-*.whl
export PYTHONPATH=$PWD:/tmp/hfsite${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/torch_ext
R=$1; mkdir -p "$R"; S=bench/results/2026-12-06-gpu-s25; : "${W:?source .device/setup.sh first: it sets W}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; date -u;
  echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"; } >> "$R/gpu.txt"
timed() { local start=$(date +%s); "$@"; echo "$* rc=$? wall_s=$(( $(date +%s) - start ))" >> "$R/gpu.txt"; }
grid() {  # grid NAME SPEC [ENV=VALUE]
  rm -rf "$W/$1"
  timed env ${3:-} python3 -m offloadlab.cli run "$2" --out "$W/$1" > "$R/$1_run.txt" 2>&1
  COLUMNS=200 python3 -m offloadlab.cli compare "$W/$1" > "$R/$1_compare.txt" 2>&1
}
case ${2:-fsdp2} in
fsdp2)
  grid grid $S/grid.toml
  grid registered $S/grid_registered.toml PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8 ;;
autotune)  # the two exact leaders, then the autotuner on s22's spec within BUDGET, counted from its start
  grid exact2 $S/exact2.toml
  rm -rf "$W/autotune"
  timed python3 -m offloadlab.cli autotune bench/results/2026-12-05-gpu-s22/spec.toml --budget "${BUDGET:-150s}" \
    --steps 6 --only zero2-cpu,zero1-cpu,fsdp2-cpu-offload-dsadam,zero2-cpu-bf16master,zero2-cpu-zenflow \
    --out "$W/autotune" > "$R/autotune.txt" 2>&1
  cp "$W/autotune/autotune.json" "$R/" 2>/dev/null ;;
esac
