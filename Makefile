# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT ?= out/demo

.PHONY: demo test venv lint typecheck unit bench clean horovod horovod-if-possible

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch is pinned: 2.13.0 is a CPU build on local disk; unpinned pulls gigabytes.
	$(BIN)/pip install --quiet -e '.[dev,parquet,torch,gurobi]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/bftrainer replay --policy milp,equal,scavenger --out $(DEMO_OUT)
	$(BIN)/bftrainer report $(DEMO_OUT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy bftrainer milp idle_monitor trainers

unit: $(STAMP)
	$(BIN)/pytest

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
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
