# The two commands of the README: `make run` and `make test`. Each installs what it
# needs by itself into a cache outside the repository (NOPSTREAM_CACHE, default
# ~/.cache/nopstream), so the second run is fast.
CACHE ?= $(HOME)/.cache/nopstream
export NOPSTREAM_CACHE := $(CACHE)
# The checkout is used in place: on PYTHONPATH, run as `python -m nopstream`.
export PYTHONPATH := $(CURDIR):$(CURDIR)/operator$(if $(PYTHONPATH),:$(PYTHONPATH))
# Compiled modules go to the cache, not the checkout, and are written even where the
# environment asks not to: otherwise every process the tests start compiles the
# project again (a quarter more CPU for each start).
export PYTHONPYCACHEPREFIX := $(CACHE)/pycache
unexport PYTHONDONTWRITEBYTECODE
VENV = $(shell scripts/venv.sh)
PY = $(VENV)/bin/python
JOB ?= examples/wordcount.yaml
# Test processes side by side (pytest-xdist); each starts its own servers, and the
# tests of the one Kubernetes cluster stay together on one of them (xdist_group "kube").
# Two on two cores: three were faster once and failed or stalled in the next run
# (docs/servers.md, "What a CI run costs").
TEST_WORKERS ?= 2

.PHONY: run test lint setup servers bench

setup:
	@scripts/venv.sh >/dev/null

servers:
	@scripts/install-servers.sh

run: setup
	$(PY) -m nopstream run $(JOB)

lint: setup
	$(VENV)/bin/ruff check nopstream operator tests bench examples e2e
	$(VENV)/bin/ruff format --check nopstream operator tests bench examples e2e
	$(VENV)/bin/mypy nopstream operator/nopstream_operator
	$(VENV)/bin/lint-imports

test: setup servers lint
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup

bench: setup
	$(PY) bench/compile.py
	$(PY) bench/throughput.py
	$(PY) bench/checkpoint.py
	$(PY) bench/joins.py
	$(PY) bench/async.py
	$(PY) bench/formats.py
	@scripts/install-servers.sh kafka
	$(PY) bench/kafka.py
	@scripts/install-servers.sh kube helm node image
	$(PY) bench/cluster.py
