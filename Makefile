# The README's two commands. Each sets up .venv on a fresh machine (or when setup.cfg changed), then runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Stamps are newer than setup.cfg/pyproject.toml when the install is current.
$(VENV)/.base-installed: setup.cfg pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test-installed: setup.cfg pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.base-installed

# A fresh run each time: workdir/demo holds the vocab, records, checkpoints, metrics and the HF export.
demo: $(VENV)/.base-installed
	rm -rf workdir/demo
	$(PY) -m bertjax.main --config=configs/demo.py --workdir=workdir/demo

test: $(VENV)/.test-installed
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache
