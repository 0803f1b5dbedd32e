"""Two groups of `PyDDStore` methods, mixed into it: registered receive buffers (kept for
upstream's API), and a method-2 extra member's join and its freed-variable checks."""

from __future__ import annotations

from . import _handshake
from ._args import recv_key as _recv_key
from ._errors import DDStoreError, DDStoreStaleError, DDStoreUnsupportedError, DDStoreValueError


class RecvBuffers:
    """`register_recv` / `unregister_recv`. The store sets `_native`, `_recv` (the keys of the
    registered buffers) and `_values_var` (a ragged variable's values part, else the name)."""

    _native: object
    _recv: set
    _values_var: object

    def register_recv(self, name: str, arr) -> None:
        """Registers `arr` once as a destination of reads of `name`, as upstream; registering
        the same buffer again is a no-op. Reads no longer need it: one-sided reads land in memory
        each reader registered once (cxi and verbs need registered buffers) and are copied into
        the destination once complete, so a read given up on a timeout never writes into it.

        Args:
            name (str): the variable whose reads land in `arr`.
            arr (numpy.ndarray): a C-contiguous buffer kept alive while registered.

        Example:
            ```python
            buf = np.empty((128, 8), np.float32)
            store.register_recv("x", buf)
            store.get_batch("x", buf, idx)
            store.unregister_recv("x", buf)
            ```
        """
        key = _recv_key(name, arr)
        if key in self._recv:
            return
        self._native.register_recv(self._values_var(name), arr)
        self._recv.add(key)

    def unregister_recv(self, name: str, arr) -> None:
        """Undoes :meth:`register_recv`; a buffer that is not registered raises DDStoreValueError.

        Args:
            name (str): the variable `arr` was registered for.
            arr (numpy.ndarray): a buffer given to `register_recv`.
        """
        key = _recv_key(name, arr)
        if key not in self._recv:
            raise DDStoreValueError(
                f"unregister_recv('{name}'): this buffer is not registered (never, or already unregistered)"
            )
        self._native.unregister_recv(self._values_var(name), arr)
        self._recv.discard(key)


class ExtraMember:
    """A method-2 extra member's `join`, and the checks that name a variable the core job freed.
    The store sets `is_extra` and `_freed_names` (name -> the error that found it freed)."""

    is_extra: bool
    _freed_names: dict

    def join(self, name: str, timeout_s: float | None = None, token: str | None = None) -> None:
        """Method 2 extra member: wait for `name` to be published, then read it.

        `token`: the core job's job token; default `DDSTORE_JOB_TOKEN`, else the token file
        the core job wrote in `handshake_dir`.

        Args:
            name (str): the variable the core group published.
            timeout_s (float | None): how long to wait for it; None: DDSTORE_HANDSHAKE_TIMEOUT_S.
            token (str | None): the core job's token; None: DDSTORE_JOB_TOKEN, else the token file in
                `handshake_dir`.

        Example:
            ```python
            extra = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=4)
            extra.join("x")
            extra.get_batch("x", out, idx)
            ```
        """
        if not self.is_extra:
            raise DDStoreUnsupportedError(
                "join() is for method=2 extra members: PyDDStore(None, method=2, n_core=N)"
            )
        _handshake.join_variable(self, name, timeout_s, token)

    def _raise_if_freed(self, name: str, error: DDStoreError) -> None:
        """Extra members, after a failed read through the fabric: raises DDStoreStaleError when
        the core job withdrew or replaced the record `name` was joined from while its process
        lives (it freed the variable); else returns and `error` stands. Costs nothing unless a
        read failed. (Reads of same-node mappings raise DDStoreStaleError themselves.)"""
        stale = _handshake.stale_error(self, name, error)
        if stale is not None:
            self._freed_names[name] = stale
            raise stale from error

    def _raise_if_known_freed(self, name: str) -> None:
        known = self._freed_names.get(name)
        if known is not None:
            e = DDStoreStaleError(str(known))
            e.peer = known.peer
            raise e
