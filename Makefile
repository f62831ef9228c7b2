# The two commands of the README are `make demo` and `make test`; `make test` runs `setup` first, `make demo`
# `demo-setup` (the same, with Alertmanager optional and no kcat). Every step is cached by a stamp file, so a
# second run takes seconds.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
CACHE := .cache
KAFKA_LIBS := $(CACHE)/kafka/libs
VENV_STAMP := $(VENV)/.installed-$(shell cat pyproject.toml emitter/pyproject.toml | sha1sum | cut -c1-12)
KAFKA_STAMP := $(KAFKA_LIBS)/.complete-$(shell cat deploy/kafka/pom.xml 2>/dev/null | sha1sum | cut -c1-12)
OTEL_DIR := $(CACHE)/otel
OTEL_STAMP := $(OTEL_DIR)/.built-$(shell cat deploy/otel/builder-config.yaml 2>/dev/null | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
# The fast tier (`make test-fast`): unit and in-process tests, the in-process chDB ones included; nothing
# that needs the real broker, worker subprocesses, Alertmanager or the Collector. Unmarked tests cannot
# open a socket or the store (tests/fixtures/network_guard.py), so these markers keep the tier honest.
FAST_MARKERS := not kafka and not e2e and not alertmanager and not promtool and not otel and not slow

.PHONY: setup demo-setup demo demo-otel otel-instrumentations test test-fast test-pythons lint bench clean kafka-jars alertmanager kcat promtool venv otelcol native

setup: venv native kafka-jars alertmanager kcat promtool

venv: $(VENV_STAMP)

# ./emitter is the service helper's own distribution (ttft-emit), a dependency of the main package that no
# index serves yet: installed in the same pip call, it satisfies that dependency from the checkout.
$(VENV_STAMP): pyproject.toml emitter/pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ./emitter -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

# The join's core compiled with mypyc into .cache/native (~45 s; again only when one of its modules
# changed). A failed build is reported and the Python source runs (streams/core/native.py).
native: venv
	@$(BIN)/python -m streams.native_build --if-stale

kafka-jars: $(KAFKA_STAMP)

$(KAFKA_STAMP): deploy/kafka/pom.xml
	@mkdir -p $(KAFKA_LIBS)
	deploy/kafka/fetch-jars.sh $(KAFKA_LIBS)
	@rm -f $(KAFKA_LIBS)/.complete-*
	@touch $@

alertmanager:
	@deploy/alertmanager/install.sh

kcat:
	@deploy/kcat/install.sh

# promtool, for Prometheus's own tests of the shipped Prometheus rules (deploy/prometheus/ttft-rules.test.yaml).
promtool:
	@deploy/prometheus/install.sh

# The OpenTelemetry Collector (otelcol-ttft) of `ttft otel up` and the tests, built with the Collector
# Builder from the pinned manifest: ~6 minutes and ~3 GB of Go caches cold, seconds once built. `make test`
# needs it; `make demo` does not wait for it, unless DEMO_ARGS has --otel (`make demo-otel` is the same).
otelcol: $(OTEL_STAMP)

$(OTEL_STAMP): deploy/otel/builder-config.yaml deploy/otel/build.sh
	deploy/otel/build.sh
	@rm -f $(OTEL_DIR)/.built-*
	@touch $@

# `make demo` needs neither Alertmanager nor kcat (kcat is for the tests): it tries to install Alertmanager,
# and when it cannot (no apt-get; not root and no passwordless sudo) says so in one line and goes on; the
# demo's alerts then go straight to its own webhook receiver.
demo-setup: venv native kafka-jars
	@TTFT_ALERTMANAGER_OPTIONAL=1 deploy/alertmanager/install.sh

# `make demo DEMO_ARGS=--otel` (or `make demo-otel`): one tenant through the OpenTelemetry Collector, which
# only then is built first, with the venv of the real instrumentation libraries its service is traced by.
demo: demo-setup $(if $(filter --otel,$(DEMO_ARGS)),otelcol otel-instrumentations)
	$(BIN)/ttft demo $(DEMO_ARGS)

# The real OpenTelemetry instrumentations' venv (tests/data/otel_instrumentations/requirements.txt), once.
otel-instrumentations: venv
	$(BIN)/python -m streams.otel.instrumentations

demo-otel:
	@$(MAKE) --no-print-directory demo DEMO_ARGS="--otel $(filter-out --otel,$(DEMO_ARGS))"

# The whole suite on TEST_WORKERS pytest-xdist workers (most of its time is spent waiting on subprocesses,
# the broker and timers; tests/fixtures/scheduling.py hands out whole files, the slowest first); the 25
# slowest tests are listed at the end. TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
# The tests marked serial (a CPU ratio, issue 27) run after that, alone: beside the other worker's tests a pass of
# the join read 36.1 µs/message where its others read 43-55. -rP prints their figures.
test: setup otelcol
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) -m "not serial" --durations=25 $(PYTEST_ARGS); rc=$$?; \
	$(BIN)/python -m pytest -m serial -rP $(PYTEST_ARGS); rc2=$$?; \
	if [ $$rc -eq 5 ] && [ $$rc2 -eq 5 ]; then echo "no tests collected"; exit 1; fi; \
	if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; if [ $$rc2 -ne 0 ] && [ $$rc2 -ne 5 ]; then exit $$rc2; fi; exit 0

# Unit and in-process tests only (~2.5 min on 2 cores); needs neither the Kafka jars, Alertmanager, kcat,
# promtool nor the Collector.
test-fast: venv native
	$(BIN)/python -m pytest -m "$(FAST_MARKERS)" --durations=10 $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

# The fast tier again on the other supported Pythons (3.11 is the main venv's), each in its own venv
# (.venv-3.12, .venv-3.13; the first run installs, ~2 min each) with its own build of the join's core.
PYTHONS ?= 3.12 3.13
test-pythons:
	@for v in $(PYTHONS); do deploy/python/fast-tier.sh $$v "$(FAST_MARKERS)" || exit 1; done

lint: venv
	$(BIN)/ruff check streams schemas tests bench emitter setup.py
	$(BIN)/ruff format --check streams schemas tests bench emitter setup.py
	$(BIN)/mypy

bench: setup otelcol
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf .ttft .pytest_cache .mypy_cache .ruff_cache .venv-3.*
