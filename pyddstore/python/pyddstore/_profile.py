"""A store's read counters: upstream pyddstore's profile keys computed from the Rust counters
(PyDDStore.get_profile), and the DDSTORE_PROFILE=1 report."""

from __future__ import annotations

from . import _log


def new_py_times() -> dict:
    """The store-wide counters get_profile() adds to the variables' (see PyDDStore.get_profile)."""
    return {"py_get": 0.0, "py_gets": 0, "epoch_sync": 0.0}


def totals(native, names: list, py_times: dict, recv_registered: int) -> dict:
    """The counters of variables `names` of store `native` (a _native.Store) summed, with the
    store-wide ones and upstream's derived keys (seconds)."""
    total: dict = {}
    for n in names:
        for k, v in native.get_profile(n).items():
            total[k] = total.get(k, 0) + v
    total.update(py_times)
    ns = {k: total.get(k, 0) for k in ("remote_ns", "copy_ns", "cq_ns", "mr_ns", "lock_ns")}
    total["py_sync"] = 0.0
    total["lock_wait"] = ns["lock_ns"] / 1e9
    total["mr"] = ns["mr_ns"] / 1e9
    posting = ns["remote_ns"] - ns["cq_ns"] - ns["mr_ns"] - ns["lock_ns"]
    total["read"] = (max(posting, 0) + ns["copy_ns"]) / 1e9
    total["cq"] = ns["cq_ns"] / 1e9
    total["mr_miss"] = 0
    total["recv_registered"] = recv_registered
    total["rejected_requests"] = native.rejected_requests
    return total


def report(native, rank: int) -> None:
    """One INFO line of read counters per variable (DDSTORE_PROFILE=1)."""
    for name in native.names():
        p = native.get_profile(name)
        _log.get_logger("store").info(
            "profile %s: %s",
            name,
            " ".join(f"{k}={v}" for k, v in p.items()),
            extra={"rank": rank},
        )


class ProfileCounters:
    """PyDDStore's get_profile(): its `_native` store, `_py_times` and `_recv` are the store's own."""

    def get_profile(self, name: str | None = None) -> dict:
        """Read counters of one variable, or summed over all of them.

        Upstream pyddstore's keys, with its meanings (times in seconds; the ``py_*`` keys are
        store-wide): ``py_gets`` the number of ``get()`` and ``get_batch()`` calls, ``py_get``
        the seconds spent in them, ``py_sync`` device synchronisation in reads (0.0: reads land
        in host memory), ``lock_wait`` waiting for a lock before posting reads (MPI below
        ``MPI_THREAD_MULTIPLE``), ``mr`` registering receive buffers (read destinations;
        providers needing ``FI_MR_LOCAL``), ``read`` posting transport reads and memory copies,
        ``cq`` waiting for the transport's completions (MPI flushes and polls), ``mr_miss`` reads whose
        destination was not registered ahead (always 0: reads register per batch). Those parts
        happen inside the ``get``/``get_batch`` calls, so upstream's summary
        ``py_get - py_sync - lock_wait - mr - read - cq`` (Python and planning) is never
        negative.

        Ours: ``calls``, ``rows``, ``bytes``, ``local_rows``, ``node_rows``, ``remote_rows``,
        ``remote_reads``, ``gather_requests`` (the part of the remote reads sent as requests
        through the owner-side gather path; the rest went one-sided), ``busy_retries`` (gather
        requests an owner answered "busy", past its ``DDSTORE_GATHER_READERS``, and this
        variable's readers sent again after a short wait), ``remote_ns`` (all
        transport time, ``cq_ns``, ``mr_ns`` and ``lock_ns`` included), ``copy_ns``,
        ``epoch_sync`` (seconds in ``epoch_begin``/``epoch_end``) and
        ``recv_registered`` (live ``register_recv`` buffers),
        ``rejected_replies`` messages this variable's readers received and discarded (gather
        replies bound to no request they made: forged, or late) and ``rejected_requests`` requests
        from the network this process's owner dropped unanswered (no proof of the job's secret, or
        beyond its bounds); with a memory budget (see the "Datasets larger than memory" guide)
        ``memory_rows`` rows read from memory, ``spilled_rows`` and ``spilled_reads`` rows and reads
        from spill files, ``prefetch_hits`` spilled rows found staged ahead, and ``spill_ns``
        (part of ``copy_ns``). For a ragged variable ``rows`` are
        its ragged rows and ``bytes`` their values.

        Args:
            name (str | None): a variable, or None for the sum over all of them.

        Example:
            ```python
            print(store.get_profile("x"))  # reads, bytes, remote/local split, ...
            ```
        """
        names = [name] if name is not None else self._native.names()
        return totals(self._native, names, self._py_times, len(self._recv))
