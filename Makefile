# The two commands of the README: `make run` and `make test`. Both install what is missing first.
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install run test lint format typecheck bench clean

install:
	@scripts/install.sh

run: install
	$(BIN)/sandhold demo

test: install
	$(BIN)/pytest -n 2 --dist loadfile -q $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: install
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/runtime_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
