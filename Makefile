# Every target creates .venv from nothing when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-full bench lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m ember demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2

test-full: $(STAMP)
	EMBER_SLOW_TESTS=1 $(BIN)/python -m pytest -q -n 2 -m ''

bench: $(STAMP)
	$(BIN)/python bench/bench_ops.py
	$(BIN)/python bench/kernel_counts.py
	$(BIN)/python bench/bench_models.py

lint: $(STAMP)
	$(BIN)/ruff check ember tests bench

clean:
	rm -rf $(VENV) build *.egg-info
