VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint unasync docs bench mutate simulate fuzz-http refusal-flood chaos clean wheel image upgrade-test

# The worker client (client/, its own distribution) goes into the same virtualenv, so
# that its tests run against this checkout's proxy; so does the `otel` extra, which the
# tracing tests need.
$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,otel]' -e ./client
	$(PY) -c 'import site, sys; open(site.getsitepackages()[0] + "/fenceproxy-checkout.pth", "w").write(sys.argv[1] + "\n")' $(CURDIR)
	touch $(STAMP)

# `make run PORT=8181 UPSTREAM_PORT=9101` (or PORT=... in the environment) moves the
# proxy and the demo upstream off 8080 and 9001.
PORT ?= 8080
UPSTREAM_PORT ?= 9001
run: $(STAMP)
	@$(PY) -m demo.run_example --port $(PORT) --upstream-port $(UPSTREAM_PORT)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m devtools.unasync_client --check
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/unit/test_complexity.py

# The sync worker client (and its tests) written from the async one
# (devtools/unasync_client.py): edit client/fenceproxy_client/_async.py, then run this.
# `make lint` fails while a generated file differs from what this writes.
unasync: $(STAMP)
	$(PY) -m devtools.unasync_client

# The generated reference pages of the docs site (devtools/docs_reference.py): the
# configuration keys and environment variables, the CLI, the OpenAPI operations and the
# error codes. `make test` fails while they differ from what this writes. `mkdocs serve`
# shows the site; `make test` builds it with --strict (tests/acceptance/test_docs_site.py).
docs: $(STAMP)
	$(PY) -m devtools.docs_reference

# The PostgreSQL tests' server (an admin URL: the tests create and drop their own
# databases there). On by default; `make test FENCEPROXY_TEST_POSTGRES_URL=` skips
# them, and any other URL (command line or environment) points them elsewhere.
test: export FENCEPROXY_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
test: lint
	$(VENV)/bin/pytest

# The rolling upgrade from the previous release (releases.toml, built from its commit
# into .cache/releases/ once) to this checkout and back, under load, on PostgreSQL
# (tests/upgrades; docs/how-to/deployment.md). `make test` runs it too; about 20 s once
# the previous release is built, which takes about 30 s more the first time.
upgrade-test: export FENCEPROXY_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
upgrade-test: $(STAMP)
	$(VENV)/bin/pytest tests/upgrades -q

bench: $(STAMP)
	$(PY) -m bench.run

# 10^5 refusals of every kind against the store, on SQLite and PostgreSQL, and how much
# the store grew (`make test` runs 2000 of each). About 2 minutes on
# SQLite and 14 on PostgreSQL on this project's loaded 2-core machine.
refusal-flood: export FENCEPROXY_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
refusal-flood: $(STAMP)
	FENCEPROXY_REFUSAL_FLOOD=100000 $(VENV)/bin/pytest tests/integration/app/test_bounded_refusals.py \
		-k flood_of_every -s -q --timeout=3600

# Mutation testing of every module of core/ and of the route templates against
# tests/unit: an hour or more (docs/contributing/index.md, "How long a run takes"), so
# not part of `make test`. Narrow it with e.g. `make mutate MUTATE_ARGS=core/probing.py`.
mutate: $(STAMP)
	$(PY) -m devtools.mutate $(MUTATE_ARGS)

# The seeded simulation of the effect lifecycle (tests/simulation): STEPS steps in all,
# in runs of SIM_STEPS, seeds from SEED on, each seed once with truthful and once with
# hostile evidence, SIM_JOBS runs at a time; SIM_BACKEND=postgres uses the server of
# `make test`. Any violation fails the run. `make simulate STEPS=1000000` (SQLite,
# 2 jobs) took 6.5 minutes on this project's 2-core machine; SIM_BACKEND=postgres
# runs about 10 times slower (round trips to the server).
STEPS ?= 100000
SIM_STEPS ?= 5000
SEED ?= 1
SIM_JOBS ?= 2
SIM_BACKEND ?= sqlite
simulate: export FENCEPROXY_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
simulate: $(STAMP)
	$(PY) -m tests.simulation --backend $(SIM_BACKEND) --evidence both --seed $(SEED) \
		--steps $(SIM_STEPS) --seeds $$(( ($(STEPS) + 2 * $(SIM_STEPS) - 1) / (2 * $(SIM_STEPS)) )) \
		--jobs $(SIM_JOBS)

# The proxy's wheel (no demo, support or tests) into dist/; the worker client is its
# own distribution: `$(PY) -m build --wheel client`.
wheel: $(STAMP)
	$(PY) -m build --wheel --outdir dist .
	rm -rf build  # setuptools' leftovers: a copy of the packages, not a source folder

# The proxy's OCI image, built without pulling from any registry (devtools/image.py):
# needs mmdebstrap and podman (apt-get install mmdebstrap podman) and root.
image: wheel
	$(PY) -m devtools.image

# The wire's properties (tests/wire) as a long search: FUZZ examples in all, shared by
# its seven properties, against a recording upstream and a proxy per module.
# Hypothesis's database is kept in .hypothesis/wire-fuzz between runs, so a failure
# found once is tried first next time. `make test` runs a few hundred.
FUZZ ?= 100000
fuzz-http: $(STAMP)
	WIRE_EXAMPLES=$$(( ($(FUZZ) + 6) / 7 )) WIRE_DATABASE=.hypothesis/wire-fuzz WIRE_TIMEOUT_S=0 \
		$(VENV)/bin/pytest tests/wire -p no:cacheprovider -q

# The nemesis (tests/nemesis, docs/contributing/nemesis.md): seeds from SEED, one after
# another, for DURATION seconds in all (RUN_S each), workers through real replicas while
# replicas are paused and killed and the store fails over; judged by the upstream's own
# records. Exits non-zero on any violation; its report replays the seed.
# CHAOS_BACKENDS: any of postgres (the server of `make test`), standby (a primary and a
# synchronous standby of the run's own, failed over once per seed), sqlite.
DURATION ?= 300
RUN_S ?= 30
CHAOS_BACKENDS ?= postgres standby sqlite
chaos: export FENCEPROXY_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
chaos: $(STAMP)
	$(PY) -m tests.nemesis --seed $(SEED) --duration $(DURATION) --run-s $(RUN_S) \
		$(foreach backend,$(CHAOS_BACKENDS),--backend $(backend))

clean:
	rm -rf $(VENV) state dist build site .pytest_cache .mypy_cache .ruff_cache .hypothesis .cache
