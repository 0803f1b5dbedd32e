"""PyTorch integration: DistDataset, DistDatasetReader, WindowedDataset, row_of,
ThreadDataLoader, and FileComm (re-exported from pyddstore).

Import torch before MPI starts; with forked DataLoader workers set DDSTORE_FORK_WORKERS=1
before pyddstore is imported (see the README).
"""

from pyddstore import FileComm

from ._dataset import Buffers, DistDataset, DistDatasetReader, ForkedWorkerError
from ._loader import ThreadDataLoader
from ._schema import SchemaError, SchemaTypeError, share_of
from ._windowed import WindowedDataset, row_of

__all__ = [
    "Buffers",
    "DistDataset",
    "DistDatasetReader",
    "FileComm",
    "ForkedWorkerError",
    "SchemaError",
    "SchemaTypeError",
    "ThreadDataLoader",
    "WindowedDataset",
    "row_of",
    "share_of",
]
