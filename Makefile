# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0

.PHONY: demo test lint typecheck unit install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, from the CPU wheel on this machine's disk; the package's own range then installs nothing more.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuplan plan examples/llama3-8b-sft.yaml
	$(BIN)/gpuplan run examples/tiny-train.yaml --checkpoint-dir "$$(mktemp -d)"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check . || true
	$(BIN)/mypy

unit: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q

# Two pytest workers, each test file whole on one of them (its module fixtures, and the Ray tests of a file
# on one local Ray instance per worker): most tests wait on processes, so two overlap on these 2 cores.
# Ray and slow files go first, the autoscaler's whole cluster last, when the other worker is nearly done
# (tests/conftest.py orders them; xdist would reorder by test count), and the
# 25 slowest tests are listed so that every CI log says where the time went.
# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE): the tests start a
# few hundred Python processes (Ray's workers, servers, CLIs), each of which would compile this repository's
# modules from source again (0.2-0.4 s of CPU each).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
