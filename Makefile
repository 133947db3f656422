# hivig developer commands. `make test` and `make demo` set up .venv/ themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The stamp changes whenever the dependency list changes, so set-up reruns only when needed.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: venv test test-fast test-gpu check style demo bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=24" "setuptools>=68" wheel
	# torch first: deepspeed's build reads the installed torch, so it is built without isolation.
	$(PIP) install --quiet "torch>=2.6" "torchvision>=0.21"
	$(PIP) install --quiet --no-build-isolation "deepspeed>=0.17"
	$(PIP) install --quiet -e ".[test]"
	@rm -f $(VENV)/.installed-*
	@touch $@

check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check hivig data_gen train serve

style: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format hivig data_gen train serve tests benchmarks

test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q

test-fast: venv
	$(VENV)/bin/python -m pytest -q -m "not slow"

test-gpu: venv
	$(VENV)/bin/python -m pytest -q -m gpu

demo: venv
	$(PY) -m hivig.demo

bench: venv
	$(PY) benchmarks/bench_frame.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
