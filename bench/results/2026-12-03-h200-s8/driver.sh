#!/usr/bin/env bash
# What ran on the H200 (one GPU) in session 8, from the checkout's root, after `source .device/setup.sh`
# (which exports W, a folder on the machine's disk where O_DIRECT works) with tomli_w carried as a wheel.
# Issue 17 on a GPU: the ops build once through `offloadlab doctor --build` (what `make setup` runs),
# a second process loads them without building, and a run of every placement starts no build.
# Usage: bash bench/results/2026-12-03-h200-s8/driver.sh RESULTS_DIR
set -u
R=$1; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ time python3 -m offloadlab.cli doctor --build --nvme "$W"; } > "$R/doctor_build.txt" 2>&1
echo "doctor --build rc=$?" >> "$R/progress"
ls -la --time-style=full-iso "$TORCH_EXTENSIONS_DIR"/*/*.so > /tmp/so_after_setup.txt 2>&1
{ time python3 -m offloadlab.cli doctor --nvme "$W" --json; } > "$R/doctor_again.json" 2>&1
python3 - "$W" <<'PY'
import sys, tomllib, tomli_w
spec = tomllib.load(open("configs/gpt125m_gpu.toml", "rb"))
spec.update(nvme_path=sys.argv[1], steps=4)
open("/tmp/gpt125m_s8.toml", "w").write(tomli_w.dumps(spec))
PY
{ time python3 -m offloadlab.cli run /tmp/gpt125m_s8.toml --out "$W/run125m"; } > "$R/run125m.txt" 2>&1
echo "run rc=$?" >> "$R/progress"
ls -la --time-style=full-iso "$TORCH_EXTENSIONS_DIR"/*/*.so > /tmp/so_after_run.txt 2>&1
{ cat /tmp/so_after_setup.txt; echo "-- after the run:"; cat /tmp/so_after_run.txt; } > "$R/ops_built.txt"
cmp -s /tmp/so_after_setup.txt /tmp/so_after_run.txt && echo "no op was rebuilt by the run" >> "$R/progress"
grep -c "building DeepSpeed" "$R/run125m.txt" | sed 's/^/build lines in the run output: /' >> "$R/progress"
tar -czf "$R/logs.tar.gz" -C "$W/run125m" logs
rm -rf "$W/run125m"
