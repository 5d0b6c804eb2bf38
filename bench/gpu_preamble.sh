# Sourced by a bench/results/*/driver.sh on the GPU host, from the checkout's root, after
# `source .device/setup.sh`: installs the wheels the GPU image lacks (tomli_w, torchao; carried in .whl, out
# of git), puts the checkout on PYTHONPATH, records the GPU, and defines `run NAME SPEC`.
# Usage in a driver: R=RESULTS_DIR; source bench/gpu_preamble.sh
[ -d /tmp/hfsite/tomli_w ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/tomli_w-*.whl
[ -d /tmp/hfsite/torchao ] || python3 -m pip install -q --no-index --no-deps --target /tmp/hfsite .whl/torchao-*.whl
export PYTHONPATH=$PWD:/tmp/hfsite${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/torch_ext "$R"
: "${W:?source .device/setup.sh first: it sets W}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; date -u; } >> "$R/gpu.txt"

timed() { local start=$(date +%s); "$@"; echo "$* rc=$? wall_s=$(( $(date +%s) - start ))" >> "$R/gpu.txt"; }

run() {  # run NAME SPEC: the run's last lines and its comparison (table and JSON) come back
  rm -rf "$W/$1"
  timed python3 -m offloadlab.cli run "$2" --out "$W/$1" > "$W/$1.log" 2>&1
  tail -40 "$W/$1.log" > "$R/$1_run_tail.txt"
  COLUMNS=200 python3 -m offloadlab.cli compare "$W/$1" > "$R/$1_compare.txt" 2>&1
  python3 -m offloadlab.cli compare "$W/$1" --json > "$R/$1_compare.json" 2>&1
}
