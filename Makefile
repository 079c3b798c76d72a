# kappa-sweep: `make demo` and `make test` do all the set-up on a fresh clone.
# Debian's python3.11 where there is one (with its venv module): Debian builds it with profile-
# guided and link-time optimisation, pyenv's default build without, and the suite spends about
# a sixth more CPU under the latter (docs/performance.md, "The interpreter"). PYTHON=... overrides.
PYTHON ?= $(shell /usr/bin/python3.11 -c 'import ensurepip, venv' 2>/dev/null && echo /usr/bin/python3.11 || echo python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test suite lint docs demo bench compose-smoke clean

# Bytecode: make's commands write it (PYTHONDONTWRITEBYTECODE, set on the CI machine, is not
# passed on), so each module is compiled once, by the first process that imports it. The suite
# imports about a third of the venv's source; compiling all of it at install took ~40 CPU-s.
unexport PYTHONDONTWRITEBYTECODE

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall whenever pyproject.toml changes: through uv where it can be had (the same packages
# in under half pip's time; scripts/uv_install.py hands it pip's settings), else through pip.
$(STAMP): pyproject.toml | $(PY)
	{ $(PY) -m pip install --quiet uv && $(PY) scripts/uv_install.py --quiet -e '.[dev]'; } \
	  || { $(PY) -m pip install --quiet --upgrade pip setuptools wheel \
	       && $(PY) -m pip install --quiet -e '.[dev]'; }
	touch $(STAMP)

# `make install` also compiles the whole venv, for commands run later where
# PYTHONDONTWRITEBYTECODE is set (each process would otherwise compile what it imports, each time).
# Its status is not checked: a few packages ship files only newer Pythons parse, which pip and uv
# skip too (torch's py312_intrinsics.py).
install: $(STAMP)
	-$(PY) -m compileall -qq -j0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors; no network needed.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict

# The suite on TEST_WORKERS pytest-xdist workers; tests marked xdist_group("exclusive") run
# one after another on one of them (docs/development.md). TEST_WORKERS=0 runs it in-process.
# Lint runs beside the suite: mypy alone would leave the second core idle. The suite builds the
# docs site with --strict itself (tests/test_docs.py), so `make docs` is not run twice.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 -Oline lint suite

# A collection first, beside lint: it writes the bytecode of all the tests import, once, before
# the workers start (each worker collects the same modules, and all at once would compile them
# three times over). Its errors are left to the run after it, which reports them.
suite: $(STAMP)
	-$(PY) -m pytest --collect-only -q -p no:cacheprovider > /dev/null 2>&1
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30

# DEMO_ARGS=--ui also starts the MLflow UI on the demo's store at the end.
demo: $(STAMP)
	$(PY) -m examples.demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks

# The docker-compose cluster built and run for real (docs/operations.md, "The smoke run"): needs a Docker
# engine, or root on Debian to start one. COMPOSE_SMOKE_ARGS=--local-bases forces the stand-ins.
compose-smoke: $(STAMP)
	scripts/compose-smoke $(COMPOSE_SMOKE_ARGS)

clean:
	rm -rf .pytest_cache .ruff_cache .mypy_cache .hypothesis site
