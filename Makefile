# The two commands of the README: `make run` and `make test`. Both install what is missing first.
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
RUN_ARGS ?=

.PHONY: install install-test run test lint format typecheck bench clean

# What serving needs; install-test adds the tools only the tests use (scripts/install.sh).
install:
	@scripts/install.sh

install-test:
	@scripts/install.sh --test

# `make run RUN_ARGS=--no-serve` stops after the tour (scripts/prove-debian.sh)
run: install
	$(BIN)/sandhold demo $(RUN_ARGS)

test: install-test
	$(BIN)/pytest -n 2 --dist loadfile -q $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: install
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

typecheck: install
	$(BIN)/mypy

# `make bench`: every benchmark with modest sizes (about 25-35 minutes on 2 cores), then one chart
# per family (bench/charts.py). Each writes $(BENCH_OUT)/<name>.json; the default is the committed
# bench/results, whose documented runs (docs/benchmarks.md) used the larger sizes quoted there, so
# `make bench BENCH_OUT=/tmp/bench BENCH_IMG=/tmp/bench` keeps a run apart. Not part of `make test`.
BENCH_OUT ?= bench/results
BENCH_IMG ?= docs/img
BENCH := $(BIN)/python bench

bench: install
	$(BENCH)/runtime_bench.py --n 20 --idle 100 --out $(BENCH_OUT)/runtime.json
	$(BENCH)/runtime_bench.py --disk --n 10 --out $(BENCH_OUT)/runtime_disk.json
	$(BENCH)/runtime_bench.py --isolation --n 10 --out $(BENCH_OUT)/runtime_isolation.json
	$(BENCH)/e2b_bench.py --n 20 --out $(BENCH_OUT)/e2b.json
	$(BENCH)/pool_bench.py --n 10 --pool 20 --out $(BENCH_OUT)/pool.json
	$(BENCH)/growth_bench.py --levels 0,1,100,500,1000 --n 10 --lists 3 --out $(BENCH_OUT)/growth.json
	$(BENCH)/listing_bench.py --n 300 --rounds 2 --out $(BENCH_OUT)/listing.json
	$(BENCH)/interpreter_bench.py --n 5 --iterations 100 --out $(BENCH_OUT)/interpreter.json
	$(BENCH)/gateway_bench.py --n 20 --paused 200 --out $(BENCH_OUT)/gateway.json
	$(BENCH)/egress_bench.py --n 300 --clients 16 --seconds 3 --out $(BENCH_OUT)/egress.json
	$(BENCH)/suspend_bench.py latency --n 5 --out $(BENCH_OUT)/suspend.json
	$(BENCH)/suspend_bench.py density --live 50 --suspended 100 --out $(BENCH_OUT)/density.json
	$(BENCH)/fork_bench.py --n 3 --out $(BENCH_OUT)/fork.json
	$(BENCH)/template_bench.py --n 2 --creates 5 --out $(BENCH_OUT)/templates.json
	$(BENCH)/soak_bench.py --cycles 1000 --kill-every 250 --out $(BENCH_OUT)/soak.json
	$(BENCH)/fleet_bench.py --n 10 --out $(BENCH_OUT)/fleet.json
	$(BENCH)/charts.py --results $(BENCH_OUT) --out $(BENCH_IMG)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
