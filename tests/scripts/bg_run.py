"""Runs the graph benchmark (pyddstore.benchmarks.graph) with the given arguments.

Usage: mpirun -n N python bg_run.py [bench_graph options]
"""

import sys

from pyddstore.benchmarks.graph import main

main(sys.argv[1:])
