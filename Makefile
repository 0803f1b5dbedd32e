# pyddstore: `make help` lists the targets.
.PHONY: help setup demo test test-long test-libfabric2 bench bench-vcluster bench-paths bench-graph bench-load bench-workers bench-spill setup-alt lint fmt soak check-memory check-no-mpi test-torch-min docs clean

help:  ## this list
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup:  ## install OS and Python dependencies, build the extension into .venv
	bash scripts/setup.sh

demo:  ## the main job: 4-rank demo + VAE example on this machine
	bash scripts/run-demo.sh

test:  ## every test (cargo test + pytest with real multi-rank jobs)
	bash scripts/run-tests.sh

test-long:  ## the longer variants of the ragged and graph tests, the bench_workers smoke (DDSTORE_TEST_LONG=1)
	bash scripts/setup.sh && . .venv/bin/activate && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
	FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo DDSTORE_TEST_LONG=1 \
	python -m pytest tests/test_ragged.py tests/test_torch_graphs.py tests/test_bench_workers.py -q

test-libfabric2:  ## libfabric 2.3.1 (third_party/, built once into ~/.cache/pyddstore): bindings check, fabric, gather and method-1 tests
	bash scripts/setup.sh && LIBFABRIC2_FULL=1 bash scripts/test-libfabric2.sh

bench:  ## the benchmark suite (python -m pyddstore bench) under mpirun -n 4
	bash scripts/setup.sh && . .venv/bin/activate && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
	FI_TCP_IFACE=lo mpirun -n 4 --bind-to none python -m pyddstore bench --json bench-results/bench.json

bench-vcluster:  ## remote rows across two virtual nodes beside one node (root; docs/developer.md)
	bash scripts/setup.sh && . .venv/bin/activate && \
	python -m pyddstore bench --vcluster --row-sizes 3072,1048576 --batch-sizes 1,128 --threads 1 \
	--json bench-results/bench-vcluster.json

bench-paths:  ## gather path vs one-sided reads over tcp, alternated per round, quiet and beside 8 busy processes
	bash scripts/setup.sh && . .venv/bin/activate && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
	FI_TCP_IFACE=lo mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.paths \
	--json bench-results/bench-paths.json && \
	FI_TCP_IFACE=lo mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.paths --busy 8 \
	--json bench-results/bench-paths-busy.json

bench-graph:  ## graphs: ragged vs padded vs per-sample records vs a local list (python -m pyddstore.benchmarks.graph)
	bash scripts/setup.sh && . .venv/bin/activate && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
	FI_TCP_IFACE=lo mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.graph --batch 128 \
	--json bench-results/bench_graph.json

bench-load:  ## load paths (npz, memmap, h5py, snapshot) beside the 64-thread read limit, cold cache as root
	bash scripts/setup.sh && . .venv/bin/activate && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
	FI_TCP_IFACE=lo DDSTORE_QUIET=1 mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.dataset --parts load \
	--json bench-results/bench-load.json

bench-spill:  ## a data set 4x the ranks' memory budgets: spilled DistDataset epoch vs raw reads, memmap, files, memory
	bash scripts/setup.sh && . .venv/bin/activate && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
	FI_TCP_IFACE=lo DDSTORE_QUIET=1 mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.spill \
	--json bench-results/bench-spill.json $(if $(wildcard .venv-alt/bin/python),--alt-python .venv-alt/bin/python)

setup-alt:  ## litdata and mosaicml-streaming in .venv-alt (make bench-spill then measures them too)
	bash scripts/setup-alt.sh

bench-workers:  ## loader workers: threads vs processes vs torch DataLoader (DistDataset, np.memmap), 2 ranks
	bash scripts/setup.sh && . .venv/bin/activate && \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
	FI_TCP_IFACE=lo mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.workers \
	--json bench-results/bench-workers.json

soak:  ## long soak: 1,000,000 verified random reads per rank per config, RSS flat (scripts/soak.sh)
	bash scripts/setup.sh && bash scripts/soak.sh 1000000 4

check-memory:  ## Rust suites under valgrind memcheck, with the libfabric scenarios
	bash scripts/check-memory.sh --ofi

check-no-mpi:  ## build without the cargo feature `mpi` in a clean venv: methods 1/2 work, method 0 raises
	bash scripts/setup.sh && . .venv/bin/activate && \
	DDSTORE_TEST_NO_MPI=1 python -m pytest tests/test_packaging.py -q -k without_mpi

test-torch-min:  ## the torch tests against the oldest supported torch (2.6, CPU wheel) in .venv-torch-min
	bash scripts/setup.sh && bash scripts/test-torch-min.sh

docs:  ## build the documentation (mkdocs --strict) into site/
	bash scripts/setup.sh && . .venv/bin/activate && python -m mkdocs build --strict

lint:  ## cargo fmt --check, clippy -D warnings (also without MPI), ruff, the _native.pyi stub check
	bash scripts/lint.sh

fmt:  ## format Rust and Python sources
	cargo fmt --all
	. .venv/bin/activate && ruff format .

clean:  ## remove build outputs
	cargo clean
	rm -rf .venv .venv-torch-min bench-results site
