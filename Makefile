# The README's two commands. Each sets up .venv on a fresh machine (or when setup.cfg changed), then runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2
SHELL := bash
.SHELLFLAGS := -eo pipefail -c

# pip -q hides minutes of work on a fresh machine, and pip's own output is hundreds of lines: this keeps a
# line per stage (every 20 packages resolved, then the install), pip's errors, and its full log in a file.
PIP_LOG := $(VENV)/pip-install.log
PIP_INSTALL := $(PY) -m pip install --progress-bar off --log $(PIP_LOG)
PIP_STAGES := awk '/^(Collecting|Processing) / { n++; if (n % 20 == 1) { print "make:   resolving and fetching, " n " packages so far"; fflush() } } \
	/^Installing collected packages: / { print "make:   installing " split(substr($$0, 32), pkgs, ", ") " packages"; fflush() } \
	/^Successfully installed/ { print "make:   installed" } \
	/^ERROR/ { print; err = 1 } END { if (err) print "make: pip failed; its full log is $(PIP_LOG)" }'

.PHONY: demo test test-quick format clean

# Refuses to start, in one sentence, what a nearly full disk would stop half-way: DISK_CHECK PATH GIB WHAT.
DISK_CHECK = $(PYTHON) -c 'import shutil, sys; path, need, what = sys.argv[1], float(sys.argv[2]), sys.argv[3]; \
	free = shutil.disk_usage(path).free / 2**30; \
	sys.exit(0 if free >= need else f"make: {free:.1f} GiB free in {path}, and {what} needs about {need:g} GiB: free some space there and rerun")'

$(PY):
	@echo "make: creating $(VENV) with $$($(PYTHON) --version), and upgrading pip in it"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Stamps are newer than setup.cfg/pyproject.toml when the install is current.
$(VENV)/.base-installed: setup.cfg pyproject.toml | $(PY)
	@echo "make: installing bertjax and its dependencies into $(VENV) (about 2 minutes on a fresh machine)"
	@$(PIP_INSTALL) -e . 2>&1 | $(PIP_STAGES)
	touch $@

$(VENV)/.test-installed: setup.cfg pyproject.toml | $(PY)
	@[ -e $@ ] || $(DISK_CHECK) . 6 "a first install of the test tools into $(VENV) (PyTorch, TensorFlow, libtpu)"
	@echo "make: installing bertjax, its dependencies and the test tools into $(VENV) (about 3 minutes on a fresh machine)"
	@$(PIP_INSTALL) -e '.[test]' 2>&1 | $(PIP_STAGES)
	touch $@ $(VENV)/.base-installed

# A fresh run each time: workdir/demo holds the vocab, records, checkpoints, metrics and the HF export;
# workdir/demo/finetune the labelled task and the two fine-tuning runs (pre-trained, random init).
demo: $(VENV)/.base-installed
	rm -rf workdir/demo
	@echo "make: the demo job, into workdir/demo (it logs its progress and ETA)"
	$(PY) -m bertjax.main --config=configs/demo.py --workdir=workdir/demo
	@echo "make: fine-tuning the pre-trained model and a random initialisation, into workdir/demo/finetune"
	$(PY) -m bertjax.demo_finetune --config=configs/demo_finetune.py --pretrained=workdir/demo --workdir=workdir/demo/finetune

# Test files are spread over PYTEST_WORKERS processes (pytest-xdist), a whole file to one worker so that
# its module fixtures are built once, the longest files first (tests/conftest.py; xdist's own reordering is
# off); PYTEST_WORKERS=0 runs them in this process. The 15 slowest tests are listed at the end.
PYTEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15
test: $(VENV)/.test-installed
	@echo "make: the test suite in $(PYTEST_WORKERS) worker processes (about 17 minutes on a 2-core AMD EPYC from a fresh clone: 16:40 and 17:50 under CI=true .ci/run, 2026-11-29)"
	@$(DISK_CHECK) "$${TMPDIR:-/tmp}" 2 "the suite (the corpora, records and checkpoints its tests write)"
	$(PYTEST) tests

# The inner loop's tier: the test files that each took at most a few seconds (tests/file_seconds.json).
test-quick: $(VENV)/.test-installed
	@echo "make: the quick tier, about 2.5 minutes on a 2-core AMD EPYC (make test runs everything)"
	$(PYTEST) --quick tests

# The code's layout, as make test checks it (tests/test_house.py: ruff format --check, the pinned ruff).
format: $(VENV)/.test-installed
	$(PY) -m ruff format bertjax tests benchmarks
	$(PY) -m ruff check bertjax tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
