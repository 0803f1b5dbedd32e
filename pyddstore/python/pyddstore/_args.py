"""Argument checks the store's methods share: integers, arrays, dtypes and receive buffers."""

from __future__ import annotations

import operator

import numpy as np

from . import _native
from ._errors import DDStoreTypeError


def dtype_name(dtype) -> str | None:
    """The stored dtype tag for a numpy dtype; None stores raw bytes."""
    if dtype is None:
        return None
    name = np.dtype(dtype).name
    return name if name in _native.DTYPES else None


def recv_key(name: str, arr) -> tuple:
    """Identifies a receive buffer by its memory (address and size), as the registration does."""
    a = arr if isinstance(arr, np.ndarray) else as_array(arr, f"register_recv('{name}', arr)")
    return (name, a.__array_interface__["data"][0], a.nbytes)


def int_arg(value, what: str) -> int:
    """An integer argument (int or numpy integer, not a float or bool)."""
    if isinstance(value, (bool, float, np.floating)):
        raise DDStoreTypeError(f"{what}={value!r} must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise DDStoreTypeError(f"{what}={value!r} must be an integer") from None


def as_array(arr, what: str):
    if isinstance(arr, np.ndarray):
        if arr.dtype.hasobject:
            raise DDStoreTypeError(
                f"{what} has dtype {arr.dtype}, which holds Python object references: pyddstore "
                "stores plain data only (numeric, bool or fixed-size bytes dtypes)"
            )
        return arr
    if hasattr(arr, "numpy") and hasattr(arr, "is_cuda"):  # torch tensor
        if arr.is_cuda:
            raise DDStoreTypeError(f"{what}: tensor is on {arr.device}; pass a CPU tensor or numpy array")
        return arr.detach().numpy()
    raise DDStoreTypeError(f"{what} must be a numpy array or CPU tensor, got {type(arr).__name__}")
