# The two commands of the README: `make demo` (the quickstart study) and `make test` (lint, then the test suite);
# `make test-fast`, the loop to live in while changing code: lint, then the tests that start no Ray cluster, no
# server and no minutes-long file (the markers tests/conftest.py sets from what each test uses).
# Both build .venv first; it is rebuilt only when pyproject.toml or constraints.txt change.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sharpscale-installed
# pytest-xdist workers for `make test`. Two on a 2-core machine: much of a Ray test is waiting on processes
# starting, which the other worker's unit tests fill. Each worker starts its own session Ray cluster; loadfile
# keeps a file's tests on one worker, so a costly fixture shared within a file (a server, a cluster) starts once.
# --no-loadscope-reorder hands out the files in collection order, where tests/conftest.py puts the minutes-long ones
# first and every file that uses the session cluster before those that don't; by default xdist orders files by their
# number of tests, which ignored that order and ran the one-test files that take minutes (the two-node cluster, the
# scale simulation) among the last. A worker past its last test that uses the session cluster stops it, which would
# otherwise idle to the end on CPU the other worker needs.
TEST_WORKERS ?= 2

# Offline and quiet: nothing is downloaded at run time, no usage reports leave the machine.
export RAY_USAGE_STATS_ENABLED := 0
export MLFLOW_DISABLE_TELEMETRY := true
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast lint install ui bench-optim bench-geometry bench-startup clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# torch first and alone, pinned: a resolver left free would fetch a multi-GB build.
	$(BIN)/pip install -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sharpscale run --new-launch studies/quickstart.yaml

# Lint first: it takes a second and fails before the suite's minutes do. Rules: [tool.ruff] in pyproject.toml;
# `ruff format .` writes the layout the check asks for.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Test by test (--dist load): no file here holds a fixture costly enough to keep its tests on one worker.
test-fast: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist load -m "not ray and not server and not slow"

ui: $(STAMP)
	$(BIN)/sharpscale ui

bench-optim: $(STAMP)
	$(BIN)/python -m benchmarks.bench_optim

bench-geometry: $(STAMP)
	$(BIN)/python -m benchmarks.bench_geometry

bench-startup: $(STAMP)
	$(BIN)/python -m benchmarks.bench_startup

clean:
	rm -rf $(VENV) mlflow.db mlartifacts sharpscale_runs studies/sharpscale_runs
