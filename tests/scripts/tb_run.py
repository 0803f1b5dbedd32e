"""Runs the PyTorch-level benchmark (pyddstore.benchmarks.dataset) with the given arguments.

Usage: mpirun -n N python tb_run.py [bench_torch options]
"""

import sys

from pyddstore.benchmarks.dataset import main

main(sys.argv[1:])
