"""The torch package's own exceptions besides the schema's (SchemaError, SchemaTypeError in
_field.py): defined here, below every module that raises them, so that rank agreement
(_agree.py) can rebuild them without importing the modules that raise them."""

from __future__ import annotations

from pyddstore import (
    DDStoreFileError,
    DDStoreFileNotFoundError,
    DDStoreFilePermissionError,
    DDStoreUnsupportedError,
)


class ForkedWorkerError(DDStoreUnsupportedError):
    """A read from a forked process, or a pickling for a spawn/forkserver one, that the
    store's method cannot serve (method 0: MPI does not cross processes).

    Example:
        ```python
        ds = DistDataset(src, "train", MPI.COMM_WORLD)  # method 0
        DataLoader(ds, num_workers=2)  # workers raise ForkedWorkerError: use ThreadDataLoader
        ```
    """


class SnapshotError(DDStoreFileError):
    """A snapshot that cannot be restored: missing or malformed manifest, a file that is
    truncated, a symbolic link, or whose checksums or layout do not match the manifest.

    Example:
        ```python
        ds.save("/lustre/me/snap")
        ds = DistDataset.restore("/lustre/me/snap")  # SnapshotError if a file was altered
        ```
    """


class SnapshotNotFoundError(SnapshotError, DDStoreFileNotFoundError):
    """A snapshot file that does not exist (ENOENT): a `SnapshotError` and a `FileNotFoundError`."""


class SnapshotPermissionError(SnapshotError, DDStoreFilePermissionError):
    """A snapshot file this process may not open or create (EACCES, EPERM): a `SnapshotError`
    and a `PermissionError`."""


def snapshot_error(message: str, errno: int | None = None) -> SnapshotError:
    """A `SnapshotError` that keeps the operating system's `errno` and, where Python maps it to
    `FileNotFoundError` or `PermissionError`, is one (`except PermissionError` catches EACCES)."""
    kind = type(OSError(errno, "")) if errno is not None else OSError
    if issubclass(kind, FileNotFoundError):
        e: SnapshotError = SnapshotNotFoundError(message)
    elif issubclass(kind, PermissionError):
        e = SnapshotPermissionError(message)
    else:
        e = SnapshotError(message)
    e.errno = errno
    return e
