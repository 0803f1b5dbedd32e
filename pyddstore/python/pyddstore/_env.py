"""Environment handling: libfabric settings applied at import, and parsing
of the DDSTORE_* variables the Python layer reads. Every variable is checked
against one table, ``ddstore_core::config::SETTINGS`` (``_native.setting``);
only the import-time flag below is parsed here, by the same rule."""

from __future__ import annotations

import os

from ._errors import DDStoreValueError

# DDSTORE_FABRIC values with a meaning of their own (hsn and tcp both mean tcp;ofi_rxm, verbs
# verbs;ofi_rxm); any other libfabric provider name is passed through (efa, opx, psm3, ucx, ...).
FABRICS = ("cxi", "verbs", "efa", "opx", "psm3", "psm2", "ucx", "hsn", "tcp", "shm", "sockets")


def check_fabric(environ=os.environ) -> list:
    """The providers DDSTORE_FABRIC makes pyddstore try, in order. DDStoreValueError when the
    value cannot be a provider name, or is none of the known names (FABRICS) and no provider
    of that name offers one-sided reads here (a typo must not pass silently, even where the
    store does not use libfabric)."""
    from . import _native

    raw = (environ.get("DDSTORE_FABRIC") or "").strip()
    candidates = _native.provider_candidates(raw or None)
    if raw and raw.lower() not in FABRICS:
        here = sorted({p["provider"] for p in _native.system_info()["providers"]})
        if candidates[0] not in here:
            raise DDStoreValueError(
                f"environment variable DDSTORE_FABRIC={raw!r} names no libfabric provider with one-sided "
                f"reads here (here: {', '.join(here) or 'none'}; known names: {', '.join(FABRICS)})"
            )
    return candidates


def apply_fabric_defaults(environ=os.environ) -> None:
    """Libfabric reads these when it starts, so they are set on import.

    FI_CXI_DISABLE_HOST_REGISTER=1 skips GPU-runtime registration of CXI host
    buffers, which fails after fork. With DDSTORE_FORK_WORKERS=1, the kdreg2
    memory monitor (Frontier's default) does not work in forked processes,
    memhooks does at the same speed.
    """
    environ.setdefault("FI_CXI_DISABLE_HOST_REGISTER", "1")
    if env_flag("DDSTORE_FORK_WORKERS", False, environ):
        if environ.get("FI_MR_CACHE_MONITOR", "") in ("", "kdreg2"):
            environ["FI_MR_CACHE_MONITOR"] = "memhooks"


def env_flag(key: str, default: bool, environ=os.environ) -> bool:
    """A switch: exactly 0, 1, true or false (the rule of ddstore_core::config)."""
    if environ is not os.environ:
        raw = environ.get(key, "").strip().lower()
        if raw in ("1", "true", "0", "false", ""):
            return default if raw == "" else raw in ("1", "true")
        raise DDStoreValueError(
            f"environment variable {key}={raw!r} is not valid: expected 0, 1, true or false"
        )
    if key == "DDSTORE_FORK_WORKERS":  # read on import, before the extension loads
        return env_flag(key, default, dict(os.environ))
    from . import _native

    value = _native.setting(key)
    return default if value is None else value == "1"


def env_int(key: str, default: int | None) -> int | None:
    """An integer setting, range-checked by the table."""
    from . import _native

    value = _native.setting(key)
    return default if value is None else int(value)


def env_seconds(key: str, default: float) -> float:
    from . import _native

    value = _native.setting(key)
    return default if value is None else float(value)


def env_choice(key: str, choices: tuple[str, ...] = (), environ=os.environ) -> str | None:
    from . import _native

    return _native.setting(key)


def check_env() -> None:
    """Every DDSTORE_* variable that is set, checked (raises DDStoreValueError naming it)."""
    from . import _native

    _native.check_env()


def resolve_method(method) -> int | None:
    """`method` argument, else DDSTORE_METHOD; None means 'choose by communicator'."""
    if method is None:
        method = env_int("DDSTORE_METHOD", None)
        if method is None:
            return None
        source = "environment variable DDSTORE_METHOD"
    else:
        source = "method"
    if isinstance(method, bool) or not isinstance(method, int) or method not in (0, 1, 2):
        raise DDStoreValueError(f"{source}={method!r} is not valid: expected 0 (MPI RMA), 1 or 2 (libfabric)")
    return method
