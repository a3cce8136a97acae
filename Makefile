# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := dev,parquet,slurm,torch,gurobi,hpo
DEMO_OUT ?= out/demo

.PHONY: demo test venv lint typecheck unit bench clean horovod horovod-if-possible upgrade-check

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch is pinned: 2.13.0 is a CPU build on local disk; unpinned pulls gigabytes.
	# constraints.txt: the versions the suite passed with (a new release changed output).
	$(BIN)/pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

# The newest versions pyproject.toml allows, in a venv of their own, through the same
# checks as `make test` (Horovod aside); constraints.txt is rewritten only if they pass,
# so an upgrade is a reviewed diff, not a surprise.
UPGRADE_VENV := .venv-upgrade
upgrade-check:
	rm -rf $(UPGRADE_VENV)
	$(PYTHON) -m venv $(UPGRADE_VENV)
	$(UPGRADE_VENV)/bin/pip install --quiet --upgrade pip
	$(UPGRADE_VENV)/bin/pip install --quiet --upgrade -e '.[$(EXTRAS)]'
	$(UPGRADE_VENV)/bin/ruff check .
	$(UPGRADE_VENV)/bin/ruff format --check .
	$(UPGRADE_VENV)/bin/mypy bftrainer milp idle_monitor trainers
	$(UPGRADE_VENV)/bin/pytest
	head -3 constraints.txt > constraints.txt.new
	$(UPGRADE_VENV)/bin/pip freeze --exclude-editable | grep -v '^bftrainer' >> constraints.txt.new
	mv constraints.txt.new constraints.txt
	git diff --stat constraints.txt || true

demo: $(STAMP)
	$(BIN)/bftrainer replay --policy milp,equal,scavenger --scavenger-size 4 --out $(DEMO_OUT)
	$(BIN)/bftrainer report $(DEMO_OUT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy bftrainer milp idle_monitor trainers

# Workers: twice the cores (most of an end-to-end test's time is waiting on a real Slurm
# and on trainers), each with a local Slurm cluster of its own (tests/conftest.py).
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(max(2, 2 * len(os.sched_getaffinity(0))))')

unit: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

# Elastic Horovod needs a patched source build (scripts/build-horovod.sh): 3-7 min
# the first time, then installed from the cached wheel in ~/.cache/bftrainer.
horovod: $(STAMP)
	bash scripts/build-horovod.sh $(BIN)/python

# For `make test`: Horovod's tests skip (and say why) when it cannot be built here.
horovod-if-possible: $(STAMP)
	-bash scripts/build-horovod.sh $(BIN)/python || echo "make: Horovod not built; its tests will skip"

test: lint typecheck horovod-if-possible unit

bench: $(STAMP)
	$(BIN)/python benchmarks/allocator.py

clean:
	rm -rf $(VENV) $(UPGRADE_VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
