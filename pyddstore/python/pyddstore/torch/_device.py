"""Device memory for shares (add_device=) and for read batches (device=): which device a
user's argument names, and the torch calls that copy and wait on it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pyddstore import DDStoreValueError
from pyddstore._args import dtype_name

from ._field import Field


def resolve_add_device(add_device: Any, host_as_device: bool) -> tuple[torch.device, str, int] | None:
    """(device, memory interface, device index) for add_device=, or None for host storage.

    host_as_device (DDSTORE_TEST_HOST_AS_DEVICE=1, for tests) takes add_device="cpu" as device
    memory of interface "system": the share is a CPU tensor registered and read exactly like a
    GPU share."""
    if add_device is None or add_device is False:
        return None
    try:
        dev = torch.device("cuda" if add_device is True else add_device)
    except (RuntimeError, TypeError) as e:
        raise DDStoreValueError(f"add_device={add_device!r} is not a device: {e}") from None
    if dev.type == "cpu":
        if host_as_device:
            return dev, "system", 0
        raise DDStoreValueError(
            f"add_device={add_device!r} needs a GPU device (e.g. 'cuda'); shares are on the host without it"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DDStoreValueError(f"add_device={add_device!r} needs a GPU, but torch.cuda is not available")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        iface = "rocr" if getattr(torch.version, "hip", None) else "cuda"
        return torch.device("cuda", index), iface, index
    if dev.type == "xpu":
        xpu = getattr(torch, "xpu", None)
        if xpu is None or not xpu.is_available():
            raise DDStoreValueError(f"add_device={add_device!r} needs an XPU, but torch.xpu is not available")
        index = dev.index if dev.index is not None else xpu.current_device()
        return torch.device("xpu", index), "ze", index
    raise DDStoreValueError(
        f"add_device={add_device!r}: device type {dev.type!r} is not supported (cuda, xpu)"
    )


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether a and b are the same device (an index-less cuda device is the current one)."""
    if a.type != b.type:
        return False
    if a.type == "cuda":
        current = torch.cuda.current_device
        return (a.index if a.index is not None else current()) == (
            b.index if b.index is not None else current()
        )
    return a.index == b.index


def sync_device(dev: torch.device) -> None:
    """Waits for copies to dev to finish, so peers read complete rows."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "xpu":
        torch.xpu.synchronize(dev)


def init_device_share(store: Any, f: Field, start: int, count: int, share_device: tuple) -> Any:
    """Collective: allocates this rank's share of f on the device; the store registers it and
    returns the DeviceShare that owns it. share_device: resolve_add_device's answer."""
    dev, iface, index = share_device
    tensor = torch.empty((count, f.row_bytes), dtype=torch.uint8, device=dev)
    disp, itemsize, dtype = f.init_args()
    if dtype is not None:
        itemsize = np.dtype(dtype).itemsize
    share = store.init_device(
        f.var, count, f.row_bytes, tensor, iface, index, itemsize=itemsize, dtype=dtype_name(dtype)
    )
    assert share.start == start and share.count == count, (share, start, count)
    return share
