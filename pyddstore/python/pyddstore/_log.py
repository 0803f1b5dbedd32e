"""Logging: every message goes to the standard ``logging`` logger ``pyddstore`` (children
``pyddstore.store``, ``pyddstore.torch``, ...), one line per event, its rank in ``record.rank``.

The library adds only a ``NullHandler``: an application configures logging as usual
(``logging.basicConfig(level=logging.INFO)``), or sets ``DDSTORE_LOG_LEVEL`` (``debug``,
``info``, ``warning``, ``error`` or a number), which gives the ``pyddstore`` logger that level
and a handler writing to stderr; that handler stays silent while the root logger has a handler
(the application's ``logging.basicConfig``), which then prints each line once. The rank of a
line is in ``record.rank`` (``extra=``), printed by that handler; an invalid level is a
warning. Levels: load summaries and the provider chosen at INFO,
fallbacks at WARNING, timings at DEBUG. ``DDSTORE_PROFILE=1`` without ``DDSTORE_LOG_LEVEL``
means ``info``, so the profile it asks for is shown.
"""

from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "pyddstore"
logger = logging.getLogger(LOGGER_NAME)
logger.addHandler(logging.NullHandler())

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_handler: logging.Handler | None = None
_fd_limit_logged = False  # the descriptor limit is raised (and logged) once per process


def get_logger(name: str = "") -> logging.Logger:
    """The ``pyddstore`` logger, or its child ``pyddstore.<name>``."""
    return logger.getChild(name) if name else logger


def _parse(raw: str) -> int | None:
    """The level DDSTORE_LOG_LEVEL names, or None (with a warning) when it names none: a typo in
    a logging variable must not stop `import pyddstore`."""
    raw = raw.strip().lower()
    if raw in _LEVELS:
        return _LEVELS[raw]
    try:
        return int(raw)
    except ValueError:
        import warnings

        warnings.warn(
            f"environment variable DDSTORE_LOG_LEVEL={raw!r} is not valid: expected debug, info, "
            "warning, error or a number; pyddstore logs as if it were unset",
            stacklevel=3,
        )
        return None


class _RankFilter(logging.Filter):
    """Gives records logged without ``extra={"rank": ...}`` a rank of "-" for the format."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            record.rank = "-"
        return True


class _StderrHandler(logging.StreamHandler):
    """DDSTORE_LOG_LEVEL's handler: writes only while the application has configured no root
    handler, so a record propagating to the application's handler is not printed twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if logger.propagate and logging.getLogger().handlers:
            return
        super().emit(record)


def configure() -> None:
    """Applies DDSTORE_LOG_LEVEL (called on import): a level and one stderr handler."""
    global _handler
    from ._env import import_time_setting

    raw = (import_time_setting("DDSTORE_LOG_LEVEL") or "").strip()
    if not raw and import_time_setting("DDSTORE_PROFILE") == "1":
        raw = "info"
    level = _parse(raw) if raw else None
    if level is None:
        return
    logger.setLevel(level)
    if _handler is None:
        _handler = _StderrHandler(sys.stderr)
        _handler.addFilter(_RankFilter())
        fmt = "%(asctime)s %(name)s %(levelname)s: rank %(rank)s: %(message)s"
        _handler.setFormatter(logging.Formatter(fmt))
        logger.addHandler(_handler)


def report_libfabric_env() -> None:
    """DEBUG: each libfabric variable `import pyddstore` set (or found set), and why."""
    from . import _native

    env = _native.libfabric_env()
    for name, (value, ours) in env["variables"].items():
        who = "set by pyddstore" if ours else "already set, kept"
        logger.debug("%s=%s (%s): %s", name, value, who, env["why"][name])


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
    global _fd_limit_logged
    from . import _native

    raised = _native.fd_limit_raised()
    if raised is not None and not _fd_limit_logged:
        _fd_limit_logged = True
        logger.debug(
            "open files limit (RLIMIT_NOFILE): soft %d raised to %d (hard %d)",
            *raised,
            extra={"rank": store.world_rank},
        )
    if store.rank == 0:
        logger.info(
            "store of %d ranks: method %s, transport %s, communicator %s",
            store.size,
            store.method,
            transport,
            store.comm_kind,
            extra={"rank": store.world_rank},
        )
    provider = transport.split(":", 1)[1] if transport.startswith("ofi:") else ""
    if provider.split(";")[0] in ("tcp", "sockets", "udp", "net") and not store.settings.is_set("fabric"):
        devices = _rdma_devices()
        if devices and store.rank == 0:
            logger.warning(
                "fell back to %s although RDMA devices are present (%s): their provider (cxi, verbs, "
                "efa, opx) is not usable; see `python -m pyddstore info`, or set DDSTORE_FABRIC",
                provider,
                ", ".join(devices),
                extra={"rank": store.world_rank},
            )
