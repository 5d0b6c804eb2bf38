# The README's two commands: `make demo` (the main job) and `make test`. Both set up .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.offloadlab-installed

.PHONY: setup demo test screenshots clean

setup: $(STAMP)

# torch is pinned to the CPU wheel this machine class carries; an open range would pull a multi-GB CUDA
# build. DeepSpeed is an sdist that must see that torch while it builds, hence --no-build-isolation.
# Its ops (compiled C++) are built here, once, into the venv's own folder, so that no run, tune, plan or
# test waits on a compiler. libaio-dev is what DeepSpeed's async_io op compiles against.
$(STAMP): pyproject.toml
	@if [ ! -e /usr/include/libaio.h ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq libaio-dev; \
	  else echo "libaio-dev is missing: run 'sudo apt-get install libaio-dev' (needed for NVMe offload)"; exit 1; fi; fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-build-isolation deepspeed==0.19.8
	$(BIN)/pip install -q --no-build-isolation -e '.[dev]'
	@echo "building DeepSpeed's compiled ops once for this venv (about 5 minutes on 2 cores)"
	$(BIN)/offloadlab doctor --build
	touch $(STAMP)

demo: setup
	$(BIN)/offloadlab run configs/tiny_cpu.toml
	d=$$(mktemp -d -p "$${TMPDIR:-/var/tmp}") && $(BIN)/offloadlab tune --nvme "$$d" --quick; rc=$$?; rmdir "$$d"; exit $$rc

test: setup
	$(BIN)/python -m pytest -q --durations=25

# The docs' screenshots, from a real demo run and a quick tune (a few minutes): docs/screenshots.py.
screenshots: setup
	$(BIN)/python docs/screenshots.py

clean:
	rm -rf $(VENV) runs
