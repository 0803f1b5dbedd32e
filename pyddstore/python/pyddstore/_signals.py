"""Python's signal handlers against the PSM libraries libfabric may link.

libinfinipath (PSM) and libpsm2 before 11 install, when they load, handlers for SIGINT, SIGTERM,
SIGSEGV, SIGBUS, SIGILL and SIGABRT that write a ``*.btr`` file into the working directory and
exit with status 1 (no ``KeyboardInterrupt``, no 143 for SIGTERM, no 134 for ``abort()``).
Debian's libfabric links them, so they load with the extension. ``prevent()`` sets the variables
that stop them (``ddstore_fabric::ofi::PROVIDER_SIGNAL_VARIABLES``, the same list; checked by
tests/test_signals.py) before the package loads the extension, unless the user set them; the
extension reports them with the libfabric variables. ``take_back()`` puts Python's handlers back
where such a library installed its own anyway (it was loaded earlier, by someone else)."""

from __future__ import annotations

import os

VARIABLES = ("IPATH_NO_BACKTRACE", "HFI_NO_BACKTRACE")

# The signals faulthandler.enable() handles (CPython's faulthandler_handlers).
_FAULT_SIGNALS = ("SIGSEGV", "SIGFPE", "SIGABRT", "SIGBUS", "SIGILL")


def prevent() -> list:
    """Sets each of VARIABLES the environment lacks to 1; returns the names set."""
    missing = [name for name in VARIABLES if name not in os.environ]
    for name in missing:
        os.environ[name] = "1"
    return missing


def take_back() -> list:
    """Puts Python's disposition back on every signal whose handler lies in a PSM library:
    the handler Python's ``signal`` module holds for it (the default where it holds none),
    or faulthandler's where it is enabled. Returns the signals taken back (main thread only:
    elsewhere ``signal.signal`` cannot run, and the list is returned untouched)."""
    import faulthandler
    import signal
    import threading

    from . import _native

    taken = _native.provider_signal_handlers()
    if not taken or threading.current_thread() is not threading.main_thread():
        return taken
    fault = {getattr(signal, name) for name in _FAULT_SIGNALS} if faulthandler.is_enabled() else set()
    for sig in taken:
        if sig not in fault:
            held = signal.getsignal(sig)
            signal.signal(sig, signal.SIG_DFL if held is None else held)
    if fault.intersection(taken):
        faulthandler.disable()  # enable() alone keeps the handlers it believes installed
        faulthandler.enable(all_threads=True)
    return taken
