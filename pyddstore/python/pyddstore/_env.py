"""Settings: where the Python layer gets its ``DDSTORE_*`` values.

Every ``DDSTORE_*`` variable is read, checked and typed by one Rust type,
``ddstore_core::config::Settings`` (``_native.Settings``; the table is
``ddstore_core::config::SETTINGS``): a store reads them once, when it is made, with its
constructor's arguments on top (``store.settings``), and code that runs without a store
(communicator resolution, ``python -m pyddstore info``) takes one snapshot per call with
``settings()``. No Python module reads a ``DDSTORE_*`` variable from ``os.environ``.

The one exception is logging, configured on import before any store exists:
``import_time_setting`` reads ``DDSTORE_LOG_LEVEL`` and ``DDSTORE_PROFILE`` (through
``_native.setting``, by the same table) for ``_log.configure``.

The libfabric variables pyddstore defaults (``FI_CXI_DISABLE_HOST_REGISTER``,
``FI_MR_CACHE_MONITOR`` with ``DDSTORE_FORK_WORKERS=1``, and for rxm providers
``FI_UNIVERSE_SIZE``, ``FI_OFI_RXM_BUFFER_SIZE``, ``FI_AV_REMOVE_CLEANUP``,
``FI_OFI_RXM_EAGER_LIMIT`` and ``FI_TCP_MAX_RX_SIZE`` over tcp) are set by the extension when it
is imported, before any thread of pyddstore or libfabric exists (``ddstore_fabric::ofi::env``;
``_native.libfabric_env()`` says what it set).
"""

from __future__ import annotations

from . import _native
from ._errors import DDStoreValueError
from ._kinds import check_method

# DDSTORE_FABRIC values with a meaning of their own (hsn and tcp both mean tcp;ofi_rxm, verbs
# verbs;ofi_rxm); any other libfabric provider name is passed through (efa, opx, psm3, ucx, ...).
FABRICS = ("cxi", "verbs", "efa", "opx", "psm3", "psm2", "ucx", "hsn", "tcp", "shm", "sockets")


def settings(**overrides) -> _native.Settings:
    """The environment's settings, checked (DDStoreValueError naming the first bad variable),
    with `overrides` (``method=1``, ``handshake_dir=...``; None keeps the variable's value)."""
    return _native.Settings.from_env(**overrides)


def import_time_setting(key: str) -> str | None:
    """One checked variable, for what is configured on import (logging) only."""
    return _native.setting(key)


def check_fabric(s: _native.Settings) -> list:
    """The providers `s.fabric` (DDSTORE_FABRIC) makes pyddstore try, in order.
    DDStoreValueError when the value cannot be a provider name, or is none of the known names
    (FABRICS) and no provider of that name offers one-sided reads here (a typo must not pass
    silently, even where the store does not use libfabric)."""
    raw = (s.fabric or "").strip()
    candidates = _native.provider_candidates(raw or None)
    if raw and raw.lower() not in FABRICS:
        here = sorted({p["provider"] for p in _native.system_info()["providers"]})
        if candidates[0] not in here:
            raise DDStoreValueError(
                f"environment variable DDSTORE_FABRIC={raw!r} names no libfabric provider with one-sided "
                f"reads here (here: {', '.join(here) or 'none'}; known names: {', '.join(FABRICS)})"
            )
    return candidates


def resolve_method(method, s: _native.Settings) -> int | None:
    """`method` argument, else DDSTORE_METHOD (from `s`); None means 'choose by communicator'."""
    if method is None:
        return s.method
    return check_method(method)


def sync_libfabric_environ() -> None:
    """Makes ``os.environ`` show the libfabric variables the extension set in the C environment
    on import (Python copies the environment once, at start-up): children started through
    ``subprocess`` or ``os.environ`` copies see what libfabric and MPI see. Only Python's copy
    is updated (no second ``setenv``, which is unsafe while another thread reads the
    environment)."""
    import os

    for name, (value, ours) in _native.libfabric_env()["variables"].items():
        if not ours or os.environ.get(name) == value:
            continue
        data = getattr(os.environ, "_data", None)
        if data is not None:
            data[os.environ.encodekey(name)] = os.environ.encodevalue(value)
        else:  # not CPython's os.environ: putenv again, to the same value
            os.environ[name] = value
