# kappa-sweep: `make demo` and `make test` do all the set-up on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel

# Reinstall whenever pyproject.toml changes.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest

demo: $(STAMP)
	$(PY) -m examples.demo

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf .pytest_cache .ruff_cache .mypy_cache .hypothesis
