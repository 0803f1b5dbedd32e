"""mpirun with DDSTORE_MPI=0 and no other communicator: comm=None raises (never a 1-rank store)."""

import numpy as np

import pyddstore

try:
    s = pyddstore.PyDDStore(None, method=1)
    s.add("x", np.zeros((4, 2)))
except pyddstore.DDStoreValueError as e:
    assert "mpirun" in str(e) and "comm=" in str(e), e
    print("no group -> DDStoreValueError")
else:
    raise AssertionError(f"a {s.size}-rank store was made under mpirun without a communicator")
