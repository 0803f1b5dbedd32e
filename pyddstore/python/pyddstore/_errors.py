"""The exception hierarchy. Every error pyddstore raises derives from
`DDStoreError`; bad arguments also derive from the matching builtin,
so `except ValueError` keeps working.

Example:
    ```python
    try:
        store.get_batch("x", out, [10**9])
    except pyddstore.DDStoreIndexError as e:  # also an IndexError
        print(e)  # names the row and the number of rows
    ```
"""

from __future__ import annotations


class DDStoreError(Exception):
    """Root of every pyddstore error.

    Attributes:
        call: the libfabric or MPI call that failed (e.g. `"fi_read"`, `"MPI_Get"`), else None.
        code: that call's return code, else None.
        peer: the rank involved (a read's owner, a rank that did not answer in time), else None.

    Example:
        ```python
        try:
            ds = DistDataset(src, "train")
        except pyddstore.DDStoreError as e:
            log.error("pyddstore: %s (call %s, code %s, peer %s)", e, e.call, e.code, e.peer)
        ```
    """

    call: str | None = None
    code: int | None = None
    peer: int | None = None


class DDStoreValueError(DDStoreError, ValueError):
    """A bad argument value (sizes, shapes, settings); also a `ValueError`.

    Example:
        ```python
        pyddstore.PyDDStore(None, method=3)  # DDStoreValueError: method=3 is not valid
        ```
    """


class DDStoreIndexError(DDStoreError, IndexError):
    """A row or sample index out of range; also an `IndexError`.

    Example:
        ```python
        ds[len(ds)]  # DDStoreIndexError: index ... is out of range
        ```
    """


class DDStoreBorrowError(DDStoreValueError):
    """An array whose memory another pyddstore call in progress is using: two threads
    reading into the same array (or overlapping views of it) at once; also a `ValueError`.
    The second call is refused before any byte moves; the first completes.

    Example:
        ```python
        # thread A: store.get_batch("x", out, idx_a)   while   thread B: store.get_batch("x", out, idx_b)
        # one of them raises DDStoreBorrowError: give each thread its own out array
        ```
    """


class DDStoreTypeError(DDStoreError, TypeError):
    """A buffer or sample of the wrong type or dtype; also a `TypeError`.

    Example:
        ```python
        store.get_batch("x", np.empty((4, 8), np.int8), idx)  # wrong dtype for a float32 variable
        ```
    """


class DDStoreKeyError(DDStoreError, KeyError):
    """An unknown variable or field name; also a `KeyError`.

    Example:
        ```python
        store.info("nope")  # DDStoreKeyError: no variable 'nope'
        ```
    """

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class DDStoreTimeoutError(DDStoreError, TimeoutError):
    """A peer (rank or core job) did not answer in time; also a `TimeoutError`.

    Example:
        ```python
        settings = pyddstore.Settings.from_env(timeout_s=30)  # a dead owner raises after 30 s
        store = pyddstore.PyDDStore(comm, settings=settings)
        ```
    """


class DDStoreAccessError(DDStoreError, PermissionError):
    """Refused: a wrong job token, or a record whose keys do not match it; also a
    `PermissionError`.

    Example:
        ```python
        extra.join("x", token="wrong")  # DDStoreAccessError
        ```
    """


class DDStoreFreedError(DDStoreError, RuntimeError):
    """The store was freed.

    Example:
        ```python
        store.free(); store.get("x", out)  # DDStoreFreedError
        ```
    """


class DDStoreStaleError(DDStoreFreedError):
    """A read of a variable its owner freed: a method-2 core job freed it (or freed it and
    added another variable under the same name) while this extra job still held it. The
    handle reads nothing more, neither the freed rows nor the new variable's; `peer` is the
    core rank. Attach again to read what the core job publishes now.

    Example:
        ```python
        try:
            extra.get_batch("x", out, idx)
        except pyddstore.DDStoreStaleError:
            extra = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=n)
            extra.join("x")  # the core job's current "x"
        ```
    """


class DDStoreUnsupportedError(DDStoreError, RuntimeError):
    """The operation is not possible with this method, communicator or process.

    Example:
        ```python
        pickle.dumps(method0_dataset)  # DDStoreUnsupportedError: use ThreadDataLoader, ...
        ```
    """


__all__ = [
    "DDStoreError",
    "DDStoreValueError",
    "DDStoreIndexError",
    "DDStoreBorrowError",
    "DDStoreTypeError",
    "DDStoreKeyError",
    "DDStoreTimeoutError",
    "DDStoreAccessError",
    "DDStoreFreedError",
    "DDStoreStaleError",
    "DDStoreUnsupportedError",
]


class DDStoreFileError(DDStoreError, OSError):
    """A source or snapshot file that cannot be used: missing, a symbolic link, not a regular
    file, truncated, or (snapshots) not what its manifest says (sizes, checksums, schema);
    also an `OSError`, whether Python or Rust (a failing `pread`, a shared-memory file) met the
    failure. `errno` is set where the operating system gave one; a missing file raises the
    `DDStoreFileNotFoundError` subclass, a refused one `DDStoreFilePermissionError`.

    Example:
        ```python
        DistDataset(["/data/missing.npy"], "x")  # DDStoreFileError names the file
        ```
    """


__all__ += ["DDStoreFileError"]


class DDStoreFileNotFoundError(DDStoreFileError, FileNotFoundError):
    """A file that does not exist (ENOENT); also a `FileNotFoundError`.

    Example:
        ```python
        except FileNotFoundError as e:  # a source file deleted before the load read it
            print(e.errno, e)
        ```
    """


class DDStoreFilePermissionError(DDStoreFileError, PermissionError):
    """A file this process may not open or read (EACCES, EPERM); also a `PermissionError`.

    Example:
        ```python
        except PermissionError as e:  # a source file another user's mode bits keep from us
            print(e)
        ```
    """


__all__ += ["DDStoreFileNotFoundError", "DDStoreFilePermissionError"]
