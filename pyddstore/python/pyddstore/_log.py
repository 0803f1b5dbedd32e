"""Logging: every message goes to the standard ``logging`` logger ``pyddstore`` (children
``pyddstore.store``, ``pyddstore.torch``, ...), one line per event with the rank in it.

The library adds only a ``NullHandler``: an application configures logging as usual
(``logging.basicConfig(level=logging.INFO)``), or sets ``DDSTORE_LOG_LEVEL`` (``debug``,
``info``, ``warning``, ``error`` or a number), which gives the ``pyddstore`` logger that level
and a handler writing to stderr. Levels: load summaries and the provider chosen at INFO,
fallbacks at WARNING, timings at DEBUG. ``DDSTORE_PROFILE=1`` without ``DDSTORE_LOG_LEVEL``
means ``info``, so the profile it asks for is shown.
"""

from __future__ import annotations

import logging
import os
import sys

from ._errors import DDStoreValueError

LOGGER_NAME = "pyddstore"
logger = logging.getLogger(LOGGER_NAME)
logger.addHandler(logging.NullHandler())

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_handler: logging.Handler | None = None


def get_logger(name: str = "") -> logging.Logger:
    """The ``pyddstore`` logger, or its child ``pyddstore.<name>``."""
    return logger.getChild(name) if name else logger


def _parse(raw: str) -> int:
    raw = raw.strip().lower()
    if raw in _LEVELS:
        return _LEVELS[raw]
    try:
        return int(raw)
    except ValueError:
        raise DDStoreValueError(
            f"environment variable DDSTORE_LOG_LEVEL={raw!r} is not valid: expected debug, info, "
            "warning, error or a number"
        ) from None


def configure() -> None:
    """Applies DDSTORE_LOG_LEVEL (called on import): a level and one stderr handler."""
    global _handler
    from ._env import import_time_setting

    raw = (import_time_setting("DDSTORE_LOG_LEVEL") or "").strip()
    if not raw and import_time_setting("DDSTORE_PROFILE") == "1":
        raw = "info"
    if not raw:
        return
    logger.setLevel(_parse(raw))
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        logger.addHandler(_handler)


def level_name() -> str:
    """The pyddstore logger's effective level, e.g. 'WARNING'."""
    return logging.getLevelName(logger.getEffectiveLevel())


def _rdma_devices() -> list:
    found = []
    for cls in ("/sys/class/infiniband", "/sys/class/cxi"):
        try:
            found += sorted(os.listdir(cls))
        except OSError:
            pass
    return found


def report_choice(store) -> None:
    """INFO: the method, transport and communicator a new store uses (rank 0 of its group);
    WARNING: a fallback to a socket provider on a node with an RDMA device."""
    transport = store.transport
    if store.rank == 0:
        logger.info(
            f"rank {store.world_rank}: store of {store.size} ranks: method {store.method}, "
            f"transport {transport}, communicator {store.comm_kind}"
        )
    provider = transport.split(":", 1)[1] if transport.startswith("ofi:") else ""
    if provider.split(";")[0] in ("tcp", "sockets", "udp", "net") and not store.settings.is_set("fabric"):
        devices = _rdma_devices()
        if devices and store.rank == 0:
            logger.warning(
                f"rank {store.world_rank}: fell back to {provider} although RDMA devices are present "
                f"({', '.join(devices)}): their provider (cxi, verbs, efa, opx) is not usable; see "
                "`python -m pyddstore info`, or set DDSTORE_FABRIC"
            )
