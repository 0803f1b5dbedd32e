"""pyddstore: a distributed in-memory dataset store for HPC deep learning.

Each rank of a job holds a share of every variable in registered memory and
reads any row of any rank with one-sided reads (MPI RMA, or libfabric on
Slingshot, InfiniBand, TCP and shared memory). ``pyddstore.torch`` builds
PyTorch datasets and loaders on top.
"""

from ._env import apply_fabric_defaults as _apply_fabric_defaults
from ._log import configure as _configure_logging

_apply_fabric_defaults()  # before libfabric starts: it reads these once
_configure_logging()  # DDSTORE_LOG_LEVEL; otherwise only a NullHandler

from . import _native  # noqa: E402
from ._comm import FileComm, TorchComm  # noqa: E402
from ._errors import (  # noqa: E402
    DDStoreAccessError,
    DDStoreBorrowError,
    DDStoreError,
    DDStoreFileError,
    DDStoreFreedError,
    DDStoreIndexError,
    DDStoreKeyError,
    DDStoreTimeoutError,
    DDStoreTypeError,
    DDStoreUnsupportedError,
    DDStoreValueError,
)
from ._store import PyDDStore  # noqa: E402

__version__ = _native.__version__

__all__ = [
    "PyDDStore",
    "FileComm",
    "TorchComm",
    "DDStoreError",
    "DDStoreAccessError",
    "DDStoreBorrowError",
    "DDStoreValueError",
    "DDStoreIndexError",
    "DDStoreTypeError",
    "DDStoreKeyError",
    "DDStoreTimeoutError",
    "DDStoreFreedError",
    "DDStoreUnsupportedError",
    "DDStoreFileError",
]
