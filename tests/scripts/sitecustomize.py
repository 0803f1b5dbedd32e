"""Imported at start-up by every Python process the tests start (tests/conftest.py puts
tests/scripts on their PYTHONPATH): each line a process prints to stdout leaves in one write.

Where PYTHONUNBUFFERED is set (as on the CI machines), `print("REFUSED", name, e)` writes each
part on its own, and mpirun interleaves the parts of ranks printing at the same moment
("REFUSED REFUSEDDDStoreAccessError ..."): a test looking for one rank's line then misses it."""

import sys

if hasattr(sys.stdout, "reconfigure"):
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
