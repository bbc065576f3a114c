# The two commands of the README: `make run` and `make test`. Each installs what it
# needs by itself into a cache outside the repository (NOPSTREAM_CACHE, default
# ~/.cache/nopstream), so the second run is fast.
CACHE ?= $(HOME)/.cache/nopstream
export NOPSTREAM_CACHE := $(CACHE)
VENV = $(shell scripts/venv.sh)
JOB ?= examples/wordcount.yaml

.PHONY: run test lint setup servers bench

setup:
	@scripts/venv.sh >/dev/null

servers:
	@scripts/install-servers.sh

run: setup
	$(VENV)/bin/nopstream run $(JOB)

lint: setup
	$(VENV)/bin/ruff check nopstream operator tests bench examples e2e
	$(VENV)/bin/ruff format --check nopstream operator tests bench examples e2e
	$(VENV)/bin/mypy nopstream operator/nopstream_operator
	$(VENV)/bin/lint-imports

test: setup servers lint
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

bench: setup
	$(VENV)/bin/python bench/compile.py
	$(VENV)/bin/python bench/throughput.py
