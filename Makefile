# The two commands a new user needs: `make run` and `make test`.
# Both create the virtualenv and install what they need on first use.

PYTHON ?= python3
# `make run PORT=17020 HOST=0.0.0.0`: where the demo host listens (and its fake provider).
HOST ?= 127.0.0.1
PORT ?= 17010
PROVIDER_PORT ?= 17011
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# LiteLLM's proxy, the baseline of bench/bench_litellm.py, lives in a virtualenv of its own, so the
# project's venv (what `make test` and CI run in) never holds its large dependency tree.
BENCH_VENV ?= .venv-bench-litellm
BENCH_STAMP := $(BENCH_VENV)/.bench-stamp
# `make test TEST_WORKERS=0` runs the suite in one process (pytest-xdist off); auto is one per core.
TEST_WORKERS ?= auto

.PHONY: run test bench bench-cost bench-gateway bench-litellm check clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

$(BENCH_STAMP): setup.cfg pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(BENCH_VENV)/bin/python -m pip check
	touch $(BENCH_STAMP)

run: $(STAMP)
	$(PY) -m llmconn.demo --host $(HOST) --port $(PORT) --provider-port $(PROVIDER_PORT)

# Tests run in parallel (pytest-xdist), each worker with its own throwaway Redis and ports; tests
# that must not run at the same time as each other (one shared resource) would carry the same
# @pytest.mark.xdist_group and so run one after another on one worker (--dist loadgroup).
# The slowest are listed at the end, to keep the suite fast.
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

# wrk drives the LiteLLM comparison; installed from the distribution when missing, as .ci/run installs redis.
WRK_INSTALLED = command -v wrk >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null)

bench: $(STAMP) $(BENCH_STAMP)
	$(WRK_INSTALLED)
	$(PY) bench/bench.py $(BENCH_ARGS)
	$(PY) bench/usage_bench.py $(BENCH_ARGS)
	$(PY) bench/bench_metrics.py $(BENCH_ARGS)
	$(PY) bench/bench_cost.py $(BENCH_ARGS)
	$(PY) bench/bench_rich.py $(BENCH_ARGS)
	$(PY) bench/bench_failover.py $(BENCH_ARGS)
	$(PY) bench/bench_gateway.py $(BENCH_ARGS)
	$(PY) bench/bench_floor.py $(BENCH_ARGS)
	$(PY) bench/bench_limits.py $(BENCH_ARGS)
	$(PY) bench/bench_litellm.py --litellm $(BENCH_VENV)/bin/litellm $(BENCH_ARGS)

bench-litellm: $(STAMP) $(BENCH_STAMP)
	$(WRK_INSTALLED)
	$(PY) bench/bench_litellm.py --litellm $(BENCH_VENV)/bin/litellm $(BENCH_ARGS)

bench-cost: $(STAMP)
	$(PY) bench/bench_cost.py $(BENCH_ARGS)

bench-gateway: $(STAMP)
	$(PY) bench/bench_gateway.py $(BENCH_ARGS)

check: $(STAMP)
	$(PY) -m llmconn check etc/llm.yaml

clean:
	rm -rf $(VENV) $(BENCH_VENV) *.egg-info .pytest_cache
