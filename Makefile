# semigrad developer tasks. Every target that needs Python sets up .venv itself.
PYTHON ?= python3
VENV ?= .venv
VENV_PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp
BENCH_STAMP := $(VENV)/.stamp-bench

HOST ?= 127.0.0.1
PORT ?= 50051
ARGS ?= --host $(HOST) --port $(PORT)
PYTEST_ARGS ?=
BENCH_ARGS ?=

PROTOS := $(wildcard proto/semigrad/v1/*.proto)
PLUGIN_PYPROJECTS := $(wildcard plugins/*/pyproject.toml)

# Never prompt (CI has no TTY); keep pip quiet about its own version.
export PIP_NO_INPUT := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := test

.PHONY: venv serve test fuzz proto bench clean distclean

# Graphviz's dot program renders pictures (RegisteredGraph.render, `semigrad viz`); installed from
# Debian's packages where possible, never failing the build (without it those tests are skipped).
venv: $(STAMP)
	@command -v dot >/dev/null || (command -v apt-get >/dev/null && (apt-get install -y -q graphviz || \
	  (apt-get update -q && apt-get install -y -q graphviz)) >/dev/null 2>&1) || \
	  echo "note: Graphviz's dot program is not installed; picture tests will be skipped"

$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls whenever pyproject.toml or a plugin's pyproject.toml changes.
$(STAMP): pyproject.toml $(PLUGIN_PYPROJECTS) | $(VENV_PY)
	$(VENV_PY) -m pip install --upgrade pip
	$(VENV_PY) -m pip install -e '.[dev,torch]'
	for f in plugins/*/pyproject.toml; do \
	  [ -e "$$f" ] || continue; \
	  $(VENV_PY) -m pip install -e "$$(dirname "$$f")"; \
	done
	touch $@

serve: venv
	$(VENV)/bin/semigrad serve $(ARGS)

test: venv
	$(VENV_PY) -m pytest -q $(PYTEST_ARGS)

# The generated-input suites of tests/fuzz with many more examples and random seeds (make test runs
# them bounded, with a fixed seed).
fuzz: venv
	SEMIGRAD_FUZZ=1 $(VENV_PY) -m pytest -q tests/fuzz $(PYTEST_ARGS)

proto: venv
	$(VENV_PY) -m grpc_tools.protoc -I proto --python_out=client --grpc_python_out=client --pyi_out=client $(PROTOS)

$(BENCH_STAMP): $(STAMP)
	$(VENV_PY) -m pip install -e '.[dev,bench]'
	touch $@

bench: $(BENCH_STAMP)
	$(VENV_PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf build dist *.egg-info client/*.egg-info server/*.egg-info .pytest_cache .hypothesis bench/out
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
