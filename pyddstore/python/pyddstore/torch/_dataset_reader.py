"""DistDatasetReader: a method-2 core group's dataset, read from a separate extra job."""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from pyddstore import DDStoreError, DDStoreValueError, PyDDStore
from pyddstore._env import settings as _env_settings
from pyddstore._handshake import RecordComm

from ._meta import read_meta
from ._read import _StoredDataset
from ._schema import Schema, check_data_cls, use_data_cls


class DistDatasetReader(_StoredDataset):
    """The dataset a method-2 core group (DistDataset(..., method=2)) holds, read from a
    separate extra job. Fields come from {handshake_dir}/{name}.meta.json. Graph samples come
    back as ``data_cls`` (a torch_geometric ``Data`` or ``HeteroData`` subclass the caller passes;
    else ``Data`` or ``HeteroData``: no class is ever imported by a name read from the meta file).

    Args:
        name (str): the name the core group's DistDataset was given.
        handshake_dir (str | None): where the core group publishes; None: DDSTORE_HANDSHAKE_DIR.
        n_core (int | None): ranks of the core group; None: DDSTORE_N_CORE, else from its records.
        device (str | torch.device | None): move read samples and batches there.
        decode (Callable | None): applied to each sample read back.
        data_cls (type | None): the torch_geometric Data or HeteroData subclass graph samples come back as;
            None: Data or HeteroData.
        comm (object | None): the extra job's own communicator (mpi4py, a torch.distributed group,
            a `pyddstore.FileComm`), collective: its rank 0 reads the meta file and each record
            and gives them to the others (a `FileComm` job: one member per node reads). None:
            every member reads them.

    Example:
        ```python
        # core job:  DistDataset(src, "train", method=2, handshake_dir=hs)
        reader = DistDatasetReader("train", handshake_dir=hs)
        x, y = reader[0]
        ```
    """

    def __init__(
        self,
        name: str,
        handshake_dir: str | None = None,
        n_core: int | None = None,
        device: str | torch.device | None = None,
        decode: Callable[[Any, int], Any] | None = None,
        data_cls: type | None = None,
        comm: object | None = None,
    ) -> None:
        super().__init__()
        check_data_cls(data_cls, "DistDatasetReader")
        settings = _env_settings()  # one snapshot: this reader's and its store's
        hs = handshake_dir or settings.handshake_dir
        if not hs:
            raise DDStoreValueError("DistDatasetReader needs handshake_dir= (or DDSTORE_HANDSHAKE_DIR)")
        # Collective over the extra job's `comm`: its files are read once per job (per node).
        record_comm = RecordComm.of(comm, settings)
        meta = read_meta(os.path.join(hs, f"{name}.meta.json"), settings.handshake_timeout_s, record_comm)
        if n_core is None:
            n_core = settings.n_core if settings.is_set("n_core") else int(meta["n_core"])
        self.name = name
        self.meta = meta
        schema = Schema.from_json(meta)
        use_data_cls(schema, data_cls, f"DistDatasetReader('{name}')")
        store = PyDDStore(
            None, method=2, handshake_dir=hs, n_core=int(n_core), settings=settings, extra_comm=record_comm
        )
        for f in schema.fields:
            store.join(f.var)
        n = int(meta["num_samples"])
        for f in schema.fields:
            total = store.info(f.var)[0]
            if total != n:
                raise DDStoreError(f"{f.var}: the core group holds {total} rows, the meta file says {n}")
        self._init_reading(store, schema, n, device, decode)
