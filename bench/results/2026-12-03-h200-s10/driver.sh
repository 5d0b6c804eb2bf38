#!/usr/bin/env bash
# What ran on the H200 in session 10 for issue 22, from the checkout's root after `source .device/setup.sh`
# (tomli_w carried in .whl/). Usage: bash bench/results/2026-12-03-h200-s10/driver.sh OUT HALF   (a, then b)
set -u
R=$1; H=$2; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/tomli_w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tomli_w*.whl
python3 bench/fastest_offload.py split configs/fastest_offload_h200.toml "$W/fo"
nproc > "$R/cpus_$H.txt"; lscpu | grep -i "model name" >> "$R/cpus_$H.txt"
timeout 490 python3 -m offloadlab.cli run "$W/fo/$H.toml" --out "$W/run_$H" > "$R/run_$H.txt" 2>&1
echo "run $H rc=$?" >> "$R/run_$H.txt"
python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$W/run_$H/offloadlab.sqlite"
tar -czf "$R/run_$H.tar.gz" -C "$W" "run_$H"
