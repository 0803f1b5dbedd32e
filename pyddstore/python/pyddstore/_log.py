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


def configure(environ=os.environ) -> None:
    """Applies DDSTORE_LOG_LEVEL (called on import): a level and one stderr handler."""
    global _handler
    raw = environ.get("DDSTORE_LOG_LEVEL", "").strip()
    if not raw and environ.get("DDSTORE_PROFILE", "").strip().lower() in ("1", "true", "yes", "on"):
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
