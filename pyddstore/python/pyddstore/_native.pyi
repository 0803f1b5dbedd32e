"""Type stubs of the PyO3 extension ``pyddstore._native`` (use the pure-Python API in ``pyddstore``)."""

from typing import Any, Callable, Literal, Optional, Sequence, Union

import numpy as np

METHODS: list[int]
HAS_MPI: bool  # False in a build without the cargo feature `mpi` (no method 0)
__version__: str

def finalize_mpi() -> None: ...
def abort_mpi(code: int) -> None: ...
def system_info() -> dict[str, Any]: ...
def provider_candidates(value: Optional[str] = None) -> list[str]: ...
def setting(key: str) -> Optional[str]: ...
def libfabric_env() -> dict[str, Any]: ...
def pid_alive(pid: int) -> bool: ...

PACKED_SHARE_BYTES: int  # bytes of one core rank's share in a method-2 record

def split_share_records(records: list[bytes]) -> tuple[str, list[bytes], bytes]: ...
def join_share_records(provider: str, addrs: list[bytes], shares: bytes) -> list[bytes]: ...

PACKED_LOCATOR_BYTES: int  # bytes of one core rank's same-node locator in a method-2 record

def pack_node_records(records: list[Optional[str]]) -> tuple[list[str], bytes]: ...
def unpack_node_records(hosts: list[str], packed: bytes) -> list[Optional[str]]: ...
def fd_limit_raised() -> Optional[tuple[int, int, int]]: ...
def provider_signal_handlers() -> list[int]: ...

PROVIDER_SIGNAL_VARIABLES: list[str]  # set by the package before it loads the extension

def file_error(message: str, errno: Optional[int] = None) -> BaseException: ...
def check_method(value: Any) -> int: ...

METHOD_NUMBERS: dict[str, int]  # ddstore_core::kinds::Method: name -> number
COMM_KINDS: list[str]
RAGGED_PARTS: list[str]  # the suffixes of a ragged variable's values and ends

DTYPES: list[str]
DIRECT_ALIGN: int  # O_DIRECT offsets, lengths and buffers align to this (ddstore_core::direct_io)

def direct_span(offset: int, len: int) -> tuple[int, int]: ...

# The launcher table (ddstore_core::launcher), one dict per launcher, and what it reads.
LAUNCHERS: list[dict[str, Any]]

def launcher(environ: Optional[dict[str, str]] = None) -> Optional[dict[str, Any]]: ...
def mpi_launched(environ: Optional[dict[str, str]] = None) -> bool: ...

class Settings:
    """Every `DDSTORE_*` setting of one store: the environment, read once, plus
    the constructor's arguments (an argument wins over its variable), each
    checked against ddstore_core's one table. Attributes are the variable
    names without `DDSTORE_`, lower case, typed: flags bool, integers int,
    seconds float, words and text str, None when unset without a default.

    Example:
        ```python
        s = pyddstore.Settings.from_env(timeout_s=5)  # the environment, plus timeout_s
        s.timeout_s, s.shm, s.fabric  # (5.0, True, None)
        store = pyddstore.PyDDStore(comm, method=1, settings=s)
        ```
    """

    @staticmethod
    def from_env(**overrides: Any) -> Settings:
        """The environment's settings, checked (DDStoreValueError naming the first
        bad variable), with `overrides` (setting names without `DDSTORE_`, lower
        case: `method=1`, `handshake_dir="/x"`; None leaves the variable's value)
        on top, each checked under its argument's name.

        Args:
            **overrides (Any): settings by name, e.g. `timeout_s=5`, `method=1`.
        """

    @staticmethod
    def _from_pairs(pairs: list[tuple[str, str]]) -> Settings: ...
    def replace(self, **overrides: Any) -> Settings:
        """These settings with `overrides` on top (as `from_env`'s; None here unsets a setting)."""

    def is_set(self, name: str) -> bool:
        """Whether the setting `name` (e.g. "fabric") was given, by its variable or an argument.

        Args:
            name (str): a setting's name: its variable without `DDSTORE_`, lower case.
        """

    def as_dict(self) -> dict[str, Any]:
        """Every setting by name (typed, defaults filled in)."""

    def __getattr__(self, name: str) -> Any: ...
    def __reduce__(self) -> Any: ...

class DeviceShare:
    """One rank's share of a variable in device memory (`DistDataset(add_device=)`):
    the one object that owns the tensor (keeping it alive), stands for its
    registration with the store (made by `Store.init_device`, released with
    the store), writes rows into it and reads batches of the variable with
    this rank's own rows gathered on the device by torch. Other ranks' rows
    come through the transport; in a forked process (which cannot use the
    device) every row does, the own ones from the parent's registered share.

    Example:
        ```python
        t = torch.empty((n, 64), dtype=torch.uint8, device="cuda")
        share = store.init_device("x", n, 64, t, "cuda", 0)  # collective
        share.write(my_rows, 0)
        share.read(out, [0, 17, 5])  # any rows; own ones gathered on the GPU
        ```
    """

    @property
    def name(self) -> str:
        """The variable's name."""

    @property
    def tensor(self) -> Any:
        """The (count, row_bytes) uint8 device tensor holding this rank's rows."""

    @property
    def start(self) -> int:
        """The first global row of this rank's share."""

    @property
    def count(self) -> int:
        """How many rows this rank holds."""

    @property
    def row_bytes(self) -> int:
        """Bytes per row."""

    @property
    def device(self) -> Any:
        """The torch device of the share."""

    def write(self, rows: np.ndarray, offset: int) -> None:
        """Writes `rows` (host rows of this variable) into the share from row
        `offset` on: one host-to-device copy.

        Args:
            rows (numpy.ndarray): host rows of `row_bytes` bytes each.
            offset (int): the first of this rank's rows to write, 0-based.
        """

    def read(self, out: np.ndarray, rows: Sequence[int] | np.ndarray, own: bool = True) -> None:
        """Reads rows `rows` of the variable into `out` (host memory, len(rows)
        rows): other ranks' rows through the transport, this rank's gathered
        on the device and copied once (`own=False` leaves them untouched, for
        `gather_own`). In a forked process every row comes through the transport.

        Args:
            out (numpy.ndarray): contiguous host buffer of len(rows) rows.
            rows (Sequence[int] | numpy.ndarray): global row numbers, any rank's, any order.
            own (bool): also copy this rank's rows (False: leave them for `gather_own`).
        """

    def gather_own(self, dst: Any, rows: Sequence[int] | np.ndarray) -> None:
        """Copies this rank's rows among `rows` into `dst` (a contiguous tensor
        of len(rows) rows on the share's device), device to device; other
        rows of `dst` are left as they are.

        Args:
            dst (torch.Tensor): contiguous, len(rows) rows, on the share's device.
            rows (Sequence[int] | numpy.ndarray): global row numbers.
        """

class Comm:
    @staticmethod
    def mpi(fortran_handle: Optional[int] = None, settings: Optional[Settings] = None) -> Comm: ...
    @staticmethod
    def file(
        handshake_dir: str,
        rank: Optional[int] = None,
        size: Optional[int] = None,
        job_id: Optional[str] = None,
        timeout_s: Optional[float] = None,
    ) -> Comm: ...
    @staticmethod
    def callback(obj: Any) -> Comm: ...
    @staticmethod
    def single() -> Comm: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def kind(self) -> str: ...
    def allgather(self, data: bytes) -> list[bytes]: ...
    def barrier(self) -> None: ...
    def split(self, color: int, key: int) -> Comm: ...

class NameLock:
    def release(self) -> None: ...

class HandshakeDir:
    def __init__(self, path: str, create: bool = True) -> None: ...
    @property
    def path(self) -> str: ...
    def write(self, name: str, data: bytes) -> None: ...
    def read(self, name: str, cap: int) -> Optional[bytes]: ...
    def wait_for(self, name: str, timeout_s: float, cap: int) -> Optional[bytes]: ...
    def remove(self, name: str) -> None: ...
    def list(self) -> list[str]: ...
    def try_lock(self, name: str, holder: str) -> Union[NameLock, str]: ...

class Store:
    def __init__(
        self, comm: Comm, method: int, nic_map: Optional[str] = None, settings: Optional[Settings] = None
    ) -> None: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def method(self) -> int: ...
    @property
    def comm_kind(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def remote_path(self) -> str: ...
    @property
    def freed(self) -> bool: ...
    @property
    def rejected_requests(self) -> int: ...
    def set_secret(self, secret: bytes) -> None: ...
    def secret(self) -> bytes | None: ...
    def comm(self) -> Comm: ...
    def barrier(self) -> None: ...
    def init(
        self,
        name: str,
        nrows: int,
        row_bytes: int,
        itemsize: int = 1,
        dtype: Optional[str] = None,
        memory_limit: Optional[int] = None,
        spill_dir: Optional[str] = None,
    ) -> None: ...
    def add(
        self, name: str, arr: np.ndarray, memory_limit: Optional[int] = None, spill_dir: Optional[str] = None
    ) -> None: ...
    def create_many(
        self, items: list[tuple], memory_limit: Optional[int] = None, spill_dir: Optional[str] = None
    ) -> None: ...
    def add_ragged(
        self,
        name: str,
        values: np.ndarray,
        lengths: Sequence[int] | np.ndarray,
        memory_limit: Optional[int] = None,
        spill_dir: Optional[str] = None,
    ) -> None: ...
    def init_ragged(
        self,
        name: str,
        lengths: Sequence[int] | np.ndarray,
        unit_bytes: int,
        fill: Callable[[str], None],
        itemsize: int = 1,
        dtype: Optional[str] = None,
        memory_limit: Optional[int] = None,
        spill_dir: Optional[str] = None,
    ) -> None: ...
    def get_ragged(
        self, name: str, indices: Sequence[int] | np.ndarray, out: Optional[np.ndarray] = None
    ) -> tuple[np.ndarray, np.ndarray]: ...
    def is_ragged(self, name: str) -> bool: ...
    def prefetch(self, name: str, rows: Sequence[int] | np.ndarray) -> int: ...
    def is_spilled(self, name: str) -> bool: ...
    def stage_capacity(self, name: str) -> int: ...
    def link_ragged(self, name: str) -> None: ...
    def update(self, name: str, arr: np.ndarray, offset: Optional[int] = None) -> None: ...
    def get(self, name: str, arr: np.ndarray, start: Optional[int] = None) -> None: ...
    def load_file_ranges(
        self,
        name: str,
        paths: Sequence[str],
        ranges: np.ndarray,
        threads: int = 32,
        direct: bool = False,
        nofollow: bool = False,
        sizes: Optional[Sequence[int]] = None,
        timeout_s: Optional[float] = None,
    ) -> tuple[int, bool]: ...
    def get_batch(
        self,
        name: str,
        arr: np.ndarray,
        indices: Sequence[int] | np.ndarray,
    ) -> None: ...
    def init_device(
        self,
        name: str,
        nrows: int,
        row_bytes: int,
        tensor: Any,
        iface: Literal["system", "cuda", "rocr", "ze"],
        device: int = 0,
        itemsize: int = 1,
        dtype: Optional[str] = None,
    ) -> DeviceShare: ...
    def get_batch_raw(self, name: str, arr: np.ndarray, indices: Sequence[int] | np.ndarray) -> None: ...
    def info(self, name: str) -> tuple[int, int, int]: ...
    def dtype(self, name: str) -> str: ...
    def row_bytes(self, name: str) -> int: ...
    def counts(self, name: str) -> list[int]: ...
    def names(self) -> list[str]: ...
    def register_recv(self, name: str, arr: np.ndarray) -> None: ...
    def unregister_recv(self, name: str, arr: np.ndarray) -> None: ...
    def populate_node_shares(self, names: list[str], max_bytes: int) -> int: ...
    def get_profile(self, name: str) -> dict[str, int]: ...
    def records(self, name: str) -> list[bytes]: ...
    def node_records(self, name: str) -> list[Optional[str]]: ...
    def attach(
        self,
        name: str,
        dtype: str,
        row_bytes: int,
        itemsize: int,
        counts: list[int],
        records: list[bytes],
        node_records: Optional[list[Optional[str]]] = None,
    ) -> None: ...
    def fork_reader(self) -> None: ...
    def free(self) -> None: ...
