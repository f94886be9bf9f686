VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench mutate clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m demo.run_example

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The PostgreSQL tests' server (an admin URL: the tests create and drop their own
# databases there). On by default; `make test FENCEPROXY_TEST_POSTGRES_URL=` skips
# them, and any other URL (command line or environment) points them elsewhere.
test: export FENCEPROXY_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
test: lint
	$(VENV)/bin/pytest

bench: $(STAMP)
	$(PY) -m bench.run

# Mutation testing of the pure rule modules against tests/unit: several minutes, so
# not part of `make test`. Narrow it with e.g. `make mutate MUTATE_ARGS=core/probing.py`.
mutate: $(STAMP)
	$(PY) -m devtools.mutate $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) state .pytest_cache .mypy_cache .ruff_cache
