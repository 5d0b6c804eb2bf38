#!/usr/bin/env bash
# What ran on the H200 in session 11 for issue 22, from the checkout's root after `source .device/setup.sh`
# (tomli_w carried in .whl/). Usage: bash bench/results/2026-12-04-h200-s11/driver.sh OUT PART
#   super: SuperOffload beside ZeRO-3 with the optimizer on the CPU and FSDP2 without offload, 31 steps each
#   nvme:  offloadlab tune --spec, then the 1.42B ZeRO-3 NVMe strategies with the tuned aio and buffers
set -u
R=$1; P=$2; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/tomli_w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tomli_w*.whl
nproc > "$R/cpus_$P.txt"; lscpu | grep -i "model name" >> "$R/cpus_$P.txt"; free -g >> "$R/cpus_$P.txt"
case $P in
super)
  python3 bench/fastest_offload.py split configs/fastest_offload_h200.toml "$W/fo"
  timeout 540 python3 -m offloadlab.cli run "$W/fo/c.toml" --out "$W/run_c" > "$R/run_c.txt" 2>&1
  echo "run c rc=$?" >> "$R/run_c.txt"
  python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$W/run_c/offloadlab.sqlite"
  tar -czf "$R/run_c.tar.gz" -C "$W" run_c ;;
nvme)
  mkdir -p "$W/nvme"
  timeout 570 python3 bench/at_scale.py configs/zero3_nvme_h200.toml --nvme "$W/nvme" --results "$R/nvme" \
    --run-dir "$W/run-nvme" --only zero3-nvme-tuned zero3-nvme-pipelined-tuned > "$R/nvme.txt" 2>&1
  echo "at_scale rc=$?" >> "$R/nvme.txt"
  tar -czf "$R/nvme.tar.gz" -C "$R" nvme && rm -rf "$R/nvme" ;;
esac
