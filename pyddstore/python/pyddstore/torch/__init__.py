"""PyTorch integration: DistDataset, DistDatasetReader, WindowedDataset, row_of,
ThreadDataLoader, DistributedSampler (no torch.distributed needed), and FileComm
(re-exported from pyddstore).

Import torch before MPI starts; with forked DataLoader workers set DDSTORE_FORK_WORKERS=1
before pyddstore is imported (see the README).

Environment read by this package:

- DDSTORE_QUIET=1: no progress bar (tqdm, when installed) and no load summary.
- DDSTORE_BATCH_GET=0: read sample by sample instead of one get_batch per field.
- DDSTORE_FAST_COLLATE=0: ThreadDataLoader collates sample by sample (no direct batch reads).
- DDSTORE_AFFINITY_WIDTH / DDSTORE_AFFINITY_OFFSET: pin ThreadDataLoader worker threads to that
  many CPUs of the process's affinity each, from that offset on.
- DDSTORE_LOAD_THREADS=N: read the source with N threads while loading (default 1; only for
  sources whose __getitem__ is thread-safe, e.g. ones that read files).
- DDSTORE_HANDSHAKE_DIR, DDSTORE_N_CORE, DDSTORE_HANDSHAKE_TIMEOUT_S: defaults for
  handshake_dir=, n_core= and how long DistDatasetReader waits for {name}.meta.json.
"""

from pyddstore import FileComm

from ._dataset import Buffers, DistDataset, DistDatasetReader, ForkedWorkerError
from ._loader import ThreadDataLoader
from ._sampler import DistributedSampler
from ._schema import RaggedRows, SchemaError, SchemaTypeError, share_of
from ._windowed import WindowedDataset, row_of

__all__ = [
    "Buffers",
    "DistDataset",
    "DistDatasetReader",
    "DistributedSampler",
    "FileComm",
    "ForkedWorkerError",
    "RaggedRows",
    "SchemaError",
    "SchemaTypeError",
    "ThreadDataLoader",
    "WindowedDataset",
    "row_of",
    "share_of",
]
