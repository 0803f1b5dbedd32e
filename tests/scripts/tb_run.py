"""Runs the PyTorch-level benchmark (pyddstore.bench_torch) with the given arguments.

Usage: mpirun -n N python tb_run.py [bench_torch options]
"""

import sys

from pyddstore.bench_torch import main

main(sys.argv[1:])
