"""pyddstore: a distributed in-memory dataset store for HPC deep learning.

Each rank of a job holds a share of every variable in registered memory and
reads any row of any rank with one-sided reads (MPI RMA, or libfabric on
Slingshot, InfiniBand, TCP and shared memory). ``pyddstore.torch`` builds
PyTorch datasets and loaders on top.
"""

# The PSM libraries Debian's libfabric links install signal handlers when the extension loads
# them, unless these variables are set: set them first (see _signals.py).
from . import _signals

_set_before_load = _signals.prevent()  # read by the extension: these count as pyddstore's

# Importing the extension sets the libfabric variables pyddstore defaults, before any thread
# of pyddstore or libfabric exists (see _env.py).
from . import _native  # noqa: E402

_signals.take_back()  # a PSM library loaded before pyddstore may have installed its own

from ._log import configure as _configure_logging  # noqa: E402

_configure_logging()  # DDSTORE_LOG_LEVEL; otherwise only a NullHandler

from ._env import sync_libfabric_environ as _sync_libfabric_environ  # noqa: E402
from ._log import report_libfabric_env as _report_libfabric_env  # noqa: E402

_sync_libfabric_environ()  # os.environ shows the FI_* variables the extension set
_report_libfabric_env()  # DEBUG: each of them, and why

from . import _attach  # noqa: E402, F401  (registers how a PyDDStore pickles)
from ._comm import FileComm, TorchComm  # noqa: E402
from ._errors import (  # noqa: E402
    DDStoreAccessError,
    DDStoreBorrowError,
    DDStoreError,
    DDStoreFileError,
    DDStoreFileNotFoundError,
    DDStoreFilePermissionError,
    DDStoreFreedError,
    DDStoreIndexError,
    DDStoreKeyError,
    DDStoreStaleError,
    DDStoreTimeoutError,
    DDStoreTypeError,
    DDStoreUnsupportedError,
    DDStoreValueError,
)
from ._kinds import CommKind, Method  # noqa: E402
from ._store import PyDDStore  # noqa: E402

__version__ = _native.__version__
DeviceShare = _native.DeviceShare
Settings = _native.Settings

__all__ = [
    "PyDDStore",
    "DeviceShare",
    "Settings",
    "Method",
    "CommKind",
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
    "DDStoreStaleError",
    "DDStoreUnsupportedError",
    "DDStoreFileError",
    "DDStoreFileNotFoundError",
    "DDStoreFilePermissionError",
]
