"""PyTorch integration: DistDataset, DistDatasetReader, WindowedDataset, row_of,
ThreadDataLoader, DistributedSampler (no torch.distributed needed), and FileComm
(re-exported from pyddstore).

Import torch before MPI starts; with forked DataLoader workers set DDSTORE_FORK_WORKERS=1
before pyddstore is imported (see the README).

Settings this package uses (read once, with the store's: ``ds.ddstore.settings``):

- DDSTORE_QUIET=1: no progress bar (tqdm, when installed) and no load summary.
- DDSTORE_BATCH_GET=0: read sample by sample instead of one get_batch per field.
- DDSTORE_FAST_COLLATE=0: ThreadDataLoader collates sample by sample (no direct batch reads).
- DDSTORE_AFFINITY_WIDTH / DDSTORE_AFFINITY_OFFSET: pin ThreadDataLoader worker threads to that
  many CPUs of the process's affinity each, from that offset on.
- DDSTORE_LOAD_DEPTH=N: reads in flight while loading a share or restoring a snapshot (default
  32; DDSTORE_LOAD_THREADS is the older name): N threads call a map-style source's __getitem__
  (one, if the source has ``thread_safe = False``), or read N large row ranges of file sources.
- DDSTORE_LOAD_DIRECT=1: read file sources (.npy lists, memmaps, contiguous h5py datasets) and
  snapshots with O_DIRECT (NVMe, Lustre), where the file system allows it.
- DDSTORE_HANDSHAKE_DIR, DDSTORE_N_CORE, DDSTORE_HANDSHAKE_TIMEOUT_S: defaults for
  handshake_dir=, n_core= and how long DistDatasetReader waits for {name}.meta.json.
"""

from pyddstore import FileComm
from pyddstore._shares import share_of

from ._dataset import DistDataset
from ._dataset_reader import DistDatasetReader
from ._errors import ForkedWorkerError, SnapshotError
from ._field import RaggedRows, SchemaError, SchemaTypeError
from ._loader import ThreadDataLoader, get_worker_info
from ._procloader import WorkerProcessError
from ._read import Buffers
from ._sampler import DistributedSampler
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
    "SnapshotError",
    "ThreadDataLoader",
    "WindowedDataset",
    "WorkerProcessError",
    "get_worker_info",
    "row_of",
    "share_of",
]
