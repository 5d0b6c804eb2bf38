#!/usr/bin/env bash
# What ran on the H200 in session 12, from the checkout's root after `source .device/setup.sh` (which exports
# W, a work folder on the machine's disk). tomli_w is carried in .whl/, matplotlib and its wheels in .mpl/.
# Usage: bash bench/results/2026-12-04-h200-s12/driver.sh OUT PART [ARGS...]
#   nvme NAME...: offloadlab tune --spec, then the named 1.42B ZeRO-3 NVMe strategies with the tuned aio and
#                 buffers (bench/at_scale.py, configs/zero3_nvme_h200.toml)
#   budget:       configs/gpu_budget_h200.toml held to 24 GiB, its FSDP2 strategy alone at 48 GiB, and what
#                 `plan --largest --gpu-mem 24` picks on this machine
set -u
R=$1; P=$2; shift 2; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/site/tomli_w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/tomli_w*.whl
# the image's numpy stays first: matplotlib goes last on the path
[ -d /tmp/mpl/matplotlib ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mpl .mpl/*.whl
export PYTHONPATH=$PYTHONPATH:/tmp/mpl
nproc > "$R/cpus_$P.txt"; lscpu | grep -i "model name" >> "$R/cpus_$P.txt"; free -g >> "$R/cpus_$P.txt"
case $P in
nvme)
  tag=$(echo "$@" | tr ' ' '+'); mkdir -p "$W/nvme"
  timeout 560 python3 bench/at_scale.py configs/zero3_nvme_h200.toml --nvme "$W/nvme" --results "$R/$tag" \
    --run-dir "$W/run-$tag" --only "$@" > "$R/$tag.txt" 2>&1
  echo "at_scale rc=$?" >> "$R/$tag.txt"
  tar -czf "$R/$tag.tar.gz" -C "$R" "$tag" && rm -rf "${R:?}/$tag" ;;
budget)
  S=configs/gpu_budget_h200.toml
  python3 -m offloadlab.cli plan "$S" --gpu-mem 24 --json > "$R/plan_24.json" 2> "$R/plan_24.err"
  timeout 330 python3 -m offloadlab.cli run "$S" --gpu-mem 24 --out "$W/b24" > "$R/run_24.txt" 2>&1
  echo "run rc=$?" >> "$R/run_24.txt"
  python3 -c "import tomllib,tomli_w,sys; s=tomllib.load(open(sys.argv[1],'rb')); \
s['strategy']=[x for x in s['strategy'] if x['name']=='fsdp2']; open(sys.argv[2],'wb').write(tomli_w.dumps(s).encode())" \
    "$S" "$W/fsdp2_only.toml"
  timeout 90 python3 -m offloadlab.cli run "$W/fsdp2_only.toml" --gpu-mem 48 --out "$W/b48" > "$R/run_48.txt" 2>&1
  echo "run rc=$?" >> "$R/run_48.txt"
  for d in b24 b48; do
    python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" \
      "$W/$d/offloadlab.sqlite"
  done
  tar -czf "$R/budget_stores.tar.gz" -C "$W" --exclude=checkpoints b24 b48
  timeout 100 python3 -m offloadlab.cli plan --largest --gpu-mem 24 --json > "$R/plan_largest_24.json" \
    2> "$R/plan_largest_24.err" ;;
esac
