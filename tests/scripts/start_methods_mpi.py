"""start_methods.py as users write MPI scripts: ``from mpi4py import MPI`` at the top, which
spawn and forkserver workers import again. Run under mpirun (methods 1 and 2 over MPI_COMM_WORLD)."""

from mpi4py import MPI  # noqa: F401 - at the top, as in examples/quickstart.py
from start_methods import main

if __name__ == "__main__":
    main()
