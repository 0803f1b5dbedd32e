"""The exception hierarchy. Every error pyddstore raises derives from
:class:`DDStoreError`; bad arguments also derive from the matching builtin,
so ``except ValueError`` keeps working."""


class DDStoreError(Exception):
    """Root of every pyddstore error."""


class DDStoreValueError(DDStoreError, ValueError):
    """A bad argument value (sizes, shapes, settings)."""


class DDStoreIndexError(DDStoreError, IndexError):
    """A row or sample index out of range."""


class DDStoreTypeError(DDStoreError, TypeError):
    """A buffer or sample of the wrong type or dtype."""


class DDStoreKeyError(DDStoreError, KeyError):
    """An unknown variable or field name."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class DDStoreTimeoutError(DDStoreError, TimeoutError):
    """A peer (rank or core job) did not answer in time."""


class DDStoreAccessError(DDStoreError, PermissionError):
    """Refused: a wrong job token, or a record whose keys do not match it."""


class DDStoreFreedError(DDStoreError, RuntimeError):
    """The store was freed."""


class DDStoreUnsupportedError(DDStoreError, RuntimeError):
    """The operation is not possible with this method, communicator or process."""


__all__ = [
    "DDStoreError",
    "DDStoreValueError",
    "DDStoreIndexError",
    "DDStoreTypeError",
    "DDStoreKeyError",
    "DDStoreTimeoutError",
    "DDStoreAccessError",
    "DDStoreFreedError",
    "DDStoreUnsupportedError",
]


class DDStoreFileError(DDStoreError, OSError):
    """A source or snapshot file that cannot be used: missing, a symbolic link, not a regular
    file, truncated, or (snapshots) not what its manifest says (sizes, checksums, schema)."""


__all__ += ["DDStoreFileError"]
