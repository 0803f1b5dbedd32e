"""Runs the spill benchmark (pyddstore.benchmarks.spill) with the given arguments.

Usage: mpirun -n N python spill_bench_run.py [spill bench options]
"""

import sys

import _common  # noqa: F401 - SIGUSR1 prints this rank's stacks
from pyddstore.benchmarks.spill import main

if __name__ == "__main__":  # forked and spawned loader workers run nothing here
    main(sys.argv[1:])
