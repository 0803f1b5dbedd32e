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
