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

.PHONY: run test bench bench-gateway check clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m llmconn.demo --host $(HOST) --port $(PORT) --provider-port $(PROVIDER_PORT)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/bench.py $(BENCH_ARGS)
	$(PY) bench/usage_bench.py $(BENCH_ARGS)
	$(PY) bench/bench_metrics.py $(BENCH_ARGS)
	$(PY) bench/bench_gateway.py $(BENCH_ARGS)

bench-gateway: $(STAMP)
	$(PY) bench/bench_gateway.py $(BENCH_ARGS)

check: $(STAMP)
	$(PY) -m llmconn check etc/llm.yaml

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
