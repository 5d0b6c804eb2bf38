#!/usr/bin/env bash
# Run in session 30 on the GPU host, from the checkout's root, after `source .device/setup.sh`.
# Usage: SEED=0 bash bench/results/2026-12-07-gpu-s30/driver.sh RESULTS_DIR check|bf16|ratio
#   check: torchao with bf16 master weights and with ratio 0.5 at 125M, each checkpoint restored and checked
#   bf16:  at 1.42B, 4 x 1024 tokens a step, 31 steps each: torchao with bf16 master weights (DeepSpeed's
#          CPU Adam, torch's AdamW) beside exact torchao, ZeRO-2's bf16 masters and FSDP2 without offload
#   ratio: at 1.42B, lr 1e-4, part of the optimizer on the GPU (ratio 0.5, 0.1), exact and bf16 masters
#   budget: ratio 0.5 and FSDP2 without offload, every rank held to 24 GiB of the GPU
set -u
R=$1; S=bench/results/2026-12-07-gpu-s30
source bench/gpu_preamble.sh
case $2 in
check) run check $S/torchao_bf16_check.toml ;;
bf16|ratio)  # the spec with the seed SEED (default 0)
  sed "s/^seed = 0/seed = ${SEED:-0}/" $S/torchao_$2.toml > "$W/torchao_$2_seed.toml"
  run $2 "$W/torchao_$2_seed.toml" ;;
budget) run budget $S/torchao_budget24.toml ;;
esac
