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
# make test runs its modules on this many processes (pytest-xdist; each test module stays on one,
# so its module-scoped servers start once): 2 cores run the suite in about half the time.
TEST_JOBS ?= auto
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

.PHONY: venv serve test fuzz loadtest compose-test proto bench clean distclean

# Two stages, so that a server is up soon after a clone. `make venv` (and `make serve`) installs
# what the service and the in-process client need: the project with its jit extra (numba: the
# compiled single points and batches docs/performance.md measures) and its plugins, nothing else.
# `make test` adds the rest on top: the dev extra (pytest, numba, grpcio-tools...), the torch
# extra (sg.from_torch's tests) and the programs some tests need (below).
DEV_STAMP := $(VENV)/.stamp-dev

# Programs from Debian's packages, installed where possible, never failing the build (without one,
# the tests that need it are skipped): Graphviz's dot renders pictures (RegisteredGraph.render,
# `semigrad viz`); redis-server is the shared graph store of replicas and haproxy the gRPC load
# balancer in front of them (tests/test_stores.py, tests/test_replicas.py; docs/deploying.md).
SYSTEM_PROGRAMS := dot:graphviz redis-server:redis-server haproxy:haproxy
venv: $(STAMP)

$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls whenever pyproject.toml or a plugin's pyproject.toml changes. One install for the
# project and every plugin (one resolution; plugins depend on numpy only), by uv where it can be
# had (a fresh clone to a healthy `make serve` took 71 s with pip, 56 s of it installing; uv
# installs the same in about half that), else by pip.
SERVE_PACKAGES := -e '.[jit]' $(foreach f,$(PLUGIN_PYPROJECTS),-e $(dir $(f)))
$(STAMP): pyproject.toml $(PLUGIN_PYPROJECTS) | $(VENV_PY)
	($(VENV_PY) -m pip install -q uv && $(VENV)/bin/uv pip install -q --python $(VENV_PY) --compile-bytecode $(SERVE_PACKAGES)) \
	  || $(VENV_PY) -m pip install -q $(SERVE_PACKAGES)
	touch $@

$(DEV_STAMP): $(STAMP)
	@for pair in $(SYSTEM_PROGRAMS); do \
	  program=$${pair%%:*}; package=$${pair##*:}; \
	  command -v $$program >/dev/null || [ -x /usr/sbin/$$program ] || \
	  (command -v apt-get >/dev/null && (DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$package || \
	    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$package)) >/dev/null 2>&1) || \
	  echo "note: $$program (Debian package $$package) is not installed; the tests that need it will be skipped"; \
	done
	$(VENV_PY) -m pip install -e '.[dev,torch]'
	touch $@

serve: venv
	$(VENV)/bin/semigrad serve $(ARGS)

test: $(DEV_STAMP)
	$(VENV_PY) -m pytest -q -n $(TEST_JOBS) --dist loadscope $(PYTEST_ARGS)

# The generated-input suites of tests/fuzz with many more examples and random seeds (make test runs
# them bounded, with a fixed seed).
fuzz: $(DEV_STAMP)
	SEMIGRAD_FUZZ=1 $(VENV_PY) -m pytest -q tests/fuzz $(PYTEST_ARGS)

# Three replicas on one Redis behind HAProxy (tests/test_replicas.py) with the acceptance load of
# issue 16: 8 clients x 1,000 mixed calls per phase (make test runs 8 x 24).
loadtest: $(DEV_STAMP)
	SEMIGRAD_REPLICA_CALLS=1000 $(VENV_PY) -m pytest -q tests/test_replicas.py $(PYTEST_ARGS)

# The compose files run for real (tests/test_deploy_compose_run.py, skipped by make test): needs a
# Docker daemon, Compose and the base images (deploy/offline-base-images.sh makes stand-ins where
# Docker Hub cannot be reached); builds the image and publishes ports 50051 and 8404.
compose-test: $(DEV_STAMP)
	SEMIGRAD_DOCKER_TESTS=1 $(VENV_PY) -m pytest -q -rs tests/test_deploy_compose_run.py $(PYTEST_ARGS)

proto: $(DEV_STAMP)
	$(VENV_PY) -m grpc_tools.protoc -I proto --python_out=client --grpc_python_out=client --pyi_out=client $(PROTOS)

$(BENCH_STAMP): $(DEV_STAMP)
	$(VENV_PY) -m pip install -e '.[dev,bench]'
	touch $@

bench: $(BENCH_STAMP)
	$(VENV_PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf build dist *.egg-info client/*.egg-info server/*.egg-info .pytest_cache .hypothesis bench/out
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
