"""Runs the graph benchmark (pyddstore.bench_graph) with the given arguments.

Usage: mpirun -n N python bg_run.py [bench_graph options]
"""

import sys

from pyddstore.bench_graph import main

main(sys.argv[1:])
