# Every target creates the environment it needs; nothing is assumed installed but python3.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# With DAGSTER_PG_HOST set, the Dagster instance is dagster.postgres.yaml (its connection
# from DAGSTER_PG_HOST, _PORT, _DB, _USERNAME, _PASSWORD; port 5432 and an empty password
# unless given) and the demo's homes are separate from the SQLite ones (docs/dagster.md);
# RELGATE_CATALOG_URL puts the catalog in PostgreSQL too.
ifdef DAGSTER_PG_HOST
INSTANCE_YAML := dagster.postgres.yaml
export DAGSTER_PG_PORT ?= 5432
export DAGSTER_PG_PASSWORD ?=
export RELGATE_HOME ?= $(CURDIR)/var/relgate-pg
export DAGSTER_HOME ?= $(CURDIR)/var/dagster-pg
else
INSTANCE_YAML := dagster.yaml
export RELGATE_HOME ?= $(CURDIR)/var/relgate
export DAGSTER_HOME ?= $(CURDIR)/var/dagster
endif

.PHONY: venv demo test lint bench bench-quick ui clean

venv: $(STAMP)

# -qq: errors only (pip's warnings about unreachable extra indexes and setuptools' editable
# install notices are not news; a failed install still prints pip's error).
$(STAMP): pyproject.toml setup.py relgate/integrity/kernel_build.py agent/pyproject.toml trust/pyproject.toml requirements.lock
	@echo "creating $(VENV) (pinned by requirements.lock; takes a few minutes)"
	@$(PY) -m venv $(VENV)
	@$(BIN)/pip install -qq --upgrade pip
	@$(BIN)/pip install -qq -c requirements.lock -e ./trust -e ./agent -e '.[dev]'
	@touch $(STAMP)

$(DAGSTER_HOME)/dagster.yaml: $(INSTANCE_YAML)
	@mkdir -p $(DAGSTER_HOME)
	@cp $(INSTANCE_YAML) $(DAGSTER_HOME)/dagster.yaml

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy relgate assets resources sensors pipelines agent/relgate_agent trust/relgate_trust
	MYPYPATH=agent:trust $(BIN)/mypy agent/lab/relgate_lab

# Three pytest workers on this 2-core machine: a third of the suite's time is spent
# waiting on subprocesses and servers (docs/performance.md, item 7), and every fixture
# (ports, PostgreSQL, moto, temporary directories) is per worker.
test: lint
	$(BIN)/pytest -q -n 3 --dist worksteal --durations=30

demo: venv $(DAGSTER_HOME)/dagster.yaml
	@$(BIN)/python -m pipelines.demo

bench: venv
	$(BIN)/python -m bench

bench-quick: venv
	$(BIN)/python -m bench --quick

ui: venv $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

clean:
	rm -rf var
