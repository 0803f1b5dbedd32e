# pyddstore: `make help` lists the targets.
.PHONY: help setup demo test test-long test-libfabric2 bench bench-vcluster bench-paths bench-graph bench-load bench-workers bench-spill bench-loaders bench-scale bench-steps setup-alt lint fmt soak check-memory check-no-mpi test-torch-min test-torch-latest docs docs-shots clean

# What the bench targets run first (the setup is skipped with SETUP=true when it is already done),
# where their JSON goes, and options added to each bench's command line: a later option wins, so
#   make bench-graph BENCH_ARGS="--graphs 64 --seconds 0.05"
# runs a shorter bench (tests/test_make_targets.py runs every target so, as root).
SETUP ?= bash scripts/setup.sh
RESULTS ?= bench-results
BENCH_ARGS ?=
# mpirun as root (containers, CI), oversubscribed, over loopback tcp.
MPI_ENV = OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 FI_TCP_IFACE=lo
SOAK_ROWS ?= 1000000
SOAK_RANKS ?= 4

help:  ## this list
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup:  ## install OS and Python dependencies, build the extension into .venv
	bash scripts/setup.sh

DEMO_ARGS ?=
demo:  ## the main job: 4-rank demo + VAE example on this machine (DEMO_ARGS: demo.py's options)
	$(SETUP) && SKIP_SETUP=1 bash scripts/run-demo.sh $(DEMO_ARGS)

test:  ## every test (cargo test + pytest with real multi-rank jobs)
	bash scripts/run-tests.sh

test-long:  ## the longer variants of the ragged and graph tests, the bench_workers smoke (DDSTORE_TEST_LONG=1)
	bash scripts/setup.sh && . .venv/bin/activate && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 \
	FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo DDSTORE_TEST_LONG=1 \
	python -m pytest tests/test_ragged.py tests/test_torch_graphs.py tests/test_bench_workers.py -q

test-libfabric2:  ## libfabric 2.3.1 (third_party/, built once into ~/.cache/pyddstore): bindings check, fabric, gather and method-1 tests
	bash scripts/setup.sh && LIBFABRIC2_FULL=1 bash scripts/test-libfabric2.sh

bench:  ## the benchmark suite (python -m pyddstore bench) under mpirun -n 4
	$(SETUP) && . .venv/bin/activate && \
	$(MPI_ENV) mpirun -n 4 --bind-to none python -m pyddstore bench --json $(RESULTS)/bench.json $(BENCH_ARGS)

bench-vcluster:  ## remote rows across two virtual nodes beside one node (root; docs/developer.md)
	$(SETUP) && . .venv/bin/activate && \
	python -m pyddstore bench --vcluster --row-sizes 3072,1048576 --batch-sizes 1,128 --threads 1 \
	--json $(RESULTS)/bench-vcluster.json $(BENCH_ARGS)

bench-paths:  ## gather path vs one-sided reads over tcp, alternated per round, quiet and beside 8 busy processes
	$(SETUP) && . .venv/bin/activate && \
	$(MPI_ENV) mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.paths \
	--json $(RESULTS)/bench-paths.json $(BENCH_ARGS) && \
	$(MPI_ENV) mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.paths --busy 8 \
	--json $(RESULTS)/bench-paths-busy.json $(BENCH_ARGS)

bench-graph:  ## graphs: ragged vs padded vs per-sample records vs a local list (python -m pyddstore.benchmarks.graph)
	$(SETUP) && . .venv/bin/activate && \
	$(MPI_ENV) mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.graph --batch 128 \
	--json $(RESULTS)/bench_graph.json $(BENCH_ARGS)

bench-load:  ## load paths (npz, memmap, h5py, snapshot) beside the 64-thread read limit, cold cache as root
	$(SETUP) && . .venv/bin/activate && \
	$(MPI_ENV) DDSTORE_QUIET=1 mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.dataset --parts load \
	--json $(RESULTS)/bench-load.json $(BENCH_ARGS)

bench-spill:  ## a data set 4x the ranks' memory budgets: spilled DistDataset epoch vs raw reads, memmap, files, memory
	$(SETUP) && . .venv/bin/activate && \
	$(MPI_ENV) DDSTORE_QUIET=1 mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.spill \
	--json $(RESULTS)/bench-spill.json $(if $(wildcard .venv-alt/bin/python),--alt-python .venv-alt/bin/python) \
	$(BENCH_ARGS)

SCALE_RANKS ?= 64
bench-scale:  ## per-rank descriptors, memory, messages of jobs of 2..SCALE_RANKS (64) ranks, every method; fits to 16,384
	$(SETUP) && . .venv/bin/activate && \
	$(MPI_ENV) python -m pyddstore.benchmarks.scale --max-ranks $(SCALE_RANKS) \
	--json $(RESULTS)/bench-scale.json $(BENCH_ARGS)

bench-steps:  ## training steps (batch, then compute sleep): AU of the store vs torch DataLoader, 4 workloads, 2 ranks
	$(SETUP) && . .venv/bin/activate && \
	$(MPI_ENV) DDSTORE_QUIET=1 mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.steps \
	--json $(RESULTS)/bench-steps.json $(BENCH_ARGS)

setup-alt:  ## litdata, mosaicml-streaming and webdataset in .venv-alt (bench-spill, bench-loaders measure them)
	bash scripts/setup-alt.sh

bench-workers:  ## loader workers: threads vs processes vs torch DataLoader (DistDataset, np.memmap), 2 ranks
	$(SETUP) && . .venv/bin/activate && \
	$(MPI_ENV) mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.workers \
	--json $(RESULTS)/bench-workers.json $(BENCH_ARGS)

# .venv-alt (make setup-alt) sees .venv's packages but not the checkout's pyddstore: PYTHONPATH does.
bench-loaders:  ## pyddstore's loader vs np.memmap, .npy files, litdata, streaming, webdataset (those in .venv-alt)
	$(SETUP) && . .venv/bin/activate && \
	PYTHONPATH=$(CURDIR)/pyddstore/python$(if $(PYTHONPATH),:$(PYTHONPATH)) \
	$(if $(wildcard .venv-alt/bin/python),.venv-alt/bin/python,python) -m pyddstore.benchmarks.loaders \
	--json $(RESULTS)/loaders.json --plot $(RESULTS)/loaders.png $(BENCH_ARGS)

soak:  ## long soak: SOAK_ROWS (1,000,000) verified random reads per rank per config, RSS flat (scripts/soak.sh)
	$(SETUP) && bash scripts/soak.sh $(SOAK_ROWS) $(SOAK_RANKS)

check-memory:  ## Rust suites under valgrind memcheck, with the libfabric scenarios
	bash scripts/check-memory.sh --ofi

check-no-mpi:  ## build without the cargo feature `mpi` in a clean venv: methods 1/2 work, method 0 raises
	bash scripts/setup.sh && . .venv/bin/activate && \
	DDSTORE_TEST_NO_MPI=1 python -m pytest tests/test_packaging.py -q -k without_mpi

test-torch-min:  ## the torch tests against the oldest supported torch (2.6, CPU wheel) in .venv-torch-min
	bash scripts/setup.sh && bash scripts/test-torch-min.sh

test-torch-latest:  ## the torch tests against the newest torch on the index (CPU wheel) in .venv-torch-latest
	bash scripts/setup.sh && bash scripts/test-torch-min.sh --latest

docs:  ## build the documentation (mkdocs --strict) into site/
	$(SETUP) && . .venv/bin/activate && python -m mkdocs build --strict

docs-shots:  ## screenshots of the built pages into site/shots/ (headless chromium); fails if a code line or column is cut
	command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	bash scripts/setup.sh && . .venv/bin/activate && python -m mkdocs build --strict && \
	python docs/shots.py --site site --out site/shots

lint:  ## cargo fmt --check, clippy -D warnings (also without MPI), ruff, the _native.pyi stub check
	bash scripts/lint.sh

fmt:  ## format Rust and Python sources
	cargo fmt --all
	. .venv/bin/activate && ruff format .

clean:  ## remove build outputs
	cargo clean
	rm -rf .venv .venv-torch-min .venv-torch-latest bench-results site
