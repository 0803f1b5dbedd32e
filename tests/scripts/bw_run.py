"""Runs the loader-workers benchmark (pyddstore.benchmarks.workers) with the given arguments.

Usage: mpirun -n N python bw_run.py [bench_workers options]
"""

import sys

from pyddstore.benchmarks.workers import main

if __name__ == "__main__":  # spawned workers import this file again: run nothing then
    main(sys.argv[1:])
