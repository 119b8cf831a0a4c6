# Every target creates the environment it needs; nothing is assumed installed but python3.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export RELGATE_HOME ?= $(CURDIR)/var/relgate
export DAGSTER_HOME ?= $(CURDIR)/var/dagster

.PHONY: venv demo test lint bench bench-quick ui clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py relgate/integrity/kernel_build.py agent/pyproject.toml requirements.lock
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev]' -e ./agent
	touch $(STAMP)

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $(DAGSTER_HOME)/dagster.yaml

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy relgate assets resources sensors pipelines agent/relgate_agent
	MYPYPATH=agent $(BIN)/mypy agent/lab/relgate_lab

# Two pytest workers: most test time is waiting on subprocesses and servers, and every
# fixture (ports, PostgreSQL, moto, temporary directories) is per worker.
test: lint
	$(BIN)/pytest -q -n 2 --dist worksteal

demo: venv $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m pipelines.demo

bench: venv
	$(BIN)/python -m bench

bench-quick: venv
	$(BIN)/python -m bench --quick

ui: venv $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

clean:
	rm -rf var
