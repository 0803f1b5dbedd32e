"""Runs the gather-vs-one-sided benchmark (pyddstore.benchmarks.paths) with the given arguments.

Usage: mpirun -n N python paths_run.py [paths options]
"""

import sys

import _common  # noqa: F401 - SIGUSR1 prints this rank's stacks
from pyddstore.benchmarks.paths import main

if __name__ == "__main__":
    main(sys.argv[1:])
