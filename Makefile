# The two quick-start commands: `make up` and `make test`.
# Both create the virtual environment on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: up bytecode compiled test test-compiled test-deps etcd-deps pg-deps test-long lint typecheck bench bench-compare fuzz sim pipeline pipeline-cluster clean

SEEDS ?= 100000
JOBS ?= 2

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,fast]'
	touch $(STAMP)

# Every module's bytecode, written ahead (only what changed is compiled again): where
# PYTHONDONTWRITEBYTECODE is set, as many Dockerfiles and some shells do (and these
# machines), each server process would otherwise compile pairmq afresh, about 0.2 s of its
# start (docs/operations.md, "Installing").
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src

# The compiled build (setup.py; docs/operations.md, "The compiled build"): the per-message
# path compiled by mypyc (the dev extra) and installed into build/compiled, which
# PYTHONPATH=build/compiled puts ahead of the pure-Python sources; built again only when a
# source changed (2-3 minutes). Without a C compiler it says so and builds nothing:
# pairmq then runs, and is tested, as pure Python only.
COMPILED := $(CURDIR)/build/compiled
COMPILED_STAMP := $(COMPILED)/.built
PAIRMQ_SOURCES := $(shell find src/pairmq -name '*.py')
HAVE_CC := $(shell $(PYTHON) -c 'import shutil, sysconfig; print(shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) or "")' 2>/dev/null)

ifeq ($(HAVE_CC),)
compiled: $(STAMP)
	@echo "No C compiler found: the compiled build is skipped; pairmq runs (and is tested) as pure Python"
	rm -rf $(COMPILED)
else
compiled: $(COMPILED_STAMP)

$(COMPILED_STAMP): $(STAMP) setup.py $(PAIRMQ_SOURCES)
	rm -rf $(COMPILED)
	# setuptools builds in build/ and would install a module an earlier build compiled
	find build -mindepth 1 -maxdepth 1 ! -name compiled -exec rm -rf {} + 2>/dev/null || true
	@echo "Compiling the per-message path with mypyc into $(COMPILED) (2-3 minutes)"
	PAIRMQ_MYPYC=1 $(BIN)/python -m pip install --quiet --no-deps --no-build-isolation --target $(COMPILED) .
	PYTHONPATH=$(COMPILED) $(BIN)/python -c 'import pairmq.core.broker.broker as b; assert b.__file__.endswith(".so"), b.__file__'
	touch $@
endif

# ARBITER=etcd: the pair's lease on a local 3-member etcd cluster instead of `pairmq witness`
# (etcd installed first when missing: etcd-deps).
ARBITER ?= witness
# The pair runs the compiled build when there is one (BUILD=pure: the sources); a build
# that fails leaves the sources running, and says so.
BUILD ?= compiled
up: $(STAMP) bytecode $(if $(filter etcd,$(ARBITER)),etcd-deps)
	$(if $(filter compiled,$(BUILD)),$(MAKE) --no-print-directory compiled || echo "The compiled build failed: the pair runs the pure-Python sources")
	if [ "$(BUILD)" = compiled ] && [ -f $(COMPILED_STAMP) ]; then export PYTHONPATH=$(COMPILED); fi; \
		$(BIN)/pairmq up --arbiter $(ARBITER)

# Programs the tests drive, from Debian, installed when missing (with sudo when not root; one
# apt-get for all): Chromium and ChromeDriver for the console's browser tests
# (tests/ha/test_console.py), etcd and etcdctl for the etcd arbiter's (tests/support/etcd.py)
# and `make up ARBITER=etcd`, PostgreSQL (Debian 12's 15: postgres, initdb, psql, pg_isready) for
# the throwaway clusters of tests/support/postgres.py. Each word is PROGRAM:PACKAGE.
BROWSER_DEBS := /usr/bin/chromium:chromium /usr/bin/chromedriver:chromium-driver
ETCD_DEBS := /usr/bin/etcd:etcd-server /usr/bin/etcdctl:etcd-client
PG_DEBS := /usr/lib/postgresql/15/bin/postgres:postgresql
# libfaketime: a server whose clock is an hour off (tests/support/database.py)
FAKETIME_DEBS := /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1:libfaketime
define install_missing_debs
	@missing=""; \
	for program_package in $(1); do \
		[ -x "$${program_package%%:*}" ] || missing="$$missing $${program_package#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -q && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi
endef

test-deps:
	$(call install_missing_debs,$(BROWSER_DEBS) $(ETCD_DEBS) $(PG_DEBS) $(FAKETIME_DEBS))

etcd-deps:
	$(call install_missing_debs,$(ETCD_DEBS))

pg-deps:
	$(call install_missing_debs,$(PG_DEBS))

# In two steps: the tests that mostly wait on servers, on TEST_WORKERS pytest-xdist workers;
# then the heavy ones (marked slow or machine, and the Spark tests: tests/conftest.py), one
# at a time. Exit status 5 is pytest's "no test selected" (PYTEST_ARGS naming only some).
TEST_WORKERS ?= 2
PYTEST_STEP = $(BIN)/python -m pytest --durations=30 $(PYTEST_ARGS)

# Then the compiled build (`make compiled`; skipped, with a line, without a C compiler):
# the tests of the layers it compiles (COMPILED_TESTS: the broker's model, the protocol, the
# journal, the STOMP server end to end, hostile clients) run again on it, about 3 minutes
# after 2 of compiling. The whole suite on it is `make test-compiled` (CI's 25 minutes
# do not hold the suite twice).
COMPILED_TESTS := tests/core tests/protocol tests/store tests/server tests/integration \
	tests/hostile tests/test_hot_objects.py

test: $(STAMP) bytecode test-deps
	$(BIN)/ruff check src tests benchmarks examples setup.py
	$(BIN)/mypy
	$(PYTEST_STEP) -m "not long and not heavy" -n $(TEST_WORKERS) || [ $$? -eq 5 ]
	$(PYTEST_STEP) -m "heavy and not long" || [ $$? -eq 5 ]
	$(MAKE) --no-print-directory compiled
	if [ -f $(COMPILED_STAMP) ]; then \
		PYTHONPATH=$(COMPILED) $(PYTEST_STEP) -m "not long and not heavy" -n $(TEST_WORKERS) \
			$(COMPILED_TESTS) || [ $$? -eq 5 ]; \
	fi

# The whole suite (but the `long` campaigns) on the compiled build, as `make test` runs it
# on the sources.
test-compiled: $(STAMP) bytecode test-deps compiled
	test -f $(COMPILED_STAMP)
	PYTHONPATH=$(COMPILED) $(PYTEST_STEP) -m "not long and not heavy" -n $(TEST_WORKERS) || [ $$? -eq 5 ]
	PYTHONPATH=$(COMPILED) $(PYTEST_STEP) -m "heavy and not long" || [ $$? -eq 5 ]

# The campaigns CI leaves out to stay under 25 minutes (tests marked `long`): flapping
# partitions, ten failovers and failbacks, 4,700 more simulator seeds (4,200 with etcd), a
# late backup syncing 100,000 messages, 300 MiB paged drained from the backup, 300 MiB
# without a consumer across a restart, a pair's backlog and its read back, the Spark write
# killed mid-way twice more; and, for CI time, variants whose case make test covers
# otherwise: the example Spark pipeline, a takeover's timing, a ring of colocated lives, a
# kill of each side of a cluster's pairs, the console's colocated view, two start orders of
# a pair and an older journal on the backup, PostgreSQL restarted `-m fast`, clocks an hour
# off, pipelined batches through a failover and a failback, 150 + 50 simulator seeds. About
# 12 minutes.
test-long: $(STAMP)
	$(BIN)/python -m pytest -m long $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples setup.py

# mypy over src/pairmq: strict on protocol/, core/, ha/ and client/ (pyproject.toml)
typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py

# This working tree against REF (a git ref), alternating runs: rate and CPU per message as
# ratios (benchmarks/compare.py). A change to the per-message path reports these.
# LOAD=stompbench drives the shared bench's load generator (../shared/bench) instead.
REF ?= main
ROUNDS ?= 6
LOAD ?= pairmq
bench-compare: $(STAMP)
	$(BIN)/python benchmarks/compare.py --ref $(REF) --rounds $(ROUNDS) --load $(LOAD)

fuzz: $(STAMP)
	$(BIN)/python benchmarks/fuzz_campaign.py --frames 1000000

# SEEDS seeded runs of the pair's simulator (ha/sim/); ARBITER=etcd: etcd as the arbiter.
sim: $(STAMP)
	$(BIN)/python -m pairmq.ha.sim --seeds $(SEEDS) --jobs $(JOBS) --arbiter $(ARBITER)

# The Spark example (examples/pipeline): orders on a stream, revenue to Parquet, alerts to
# a topic, checked at the end; local mode, or a standalone cluster (a master, 2 workers).
pipeline: $(STAMP)
	$(BIN)/python -m examples.pipeline.run

pipeline-cluster: $(STAMP)
	$(BIN)/python -m examples.pipeline.cluster

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .cache build src/*.egg-info
