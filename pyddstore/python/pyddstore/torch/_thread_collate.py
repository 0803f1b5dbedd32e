"""default_collate for batches that stay in this process (ThreadDataLoader's threads, a process
worker's plain batches): the thread loader and the process loader both use it."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data._utils import collate as _collate


def thread_collate(batch: Any) -> Any:
    """default_collate without shared-memory output tensors (pointless between threads)."""
    fn_map = dict(_collate.default_collate_fn_map)
    if fn_map.get(torch.Tensor) is _collate.collate_tensor_fn:
        fn_map[torch.Tensor] = _stack_tensors
    return _collate.collate(batch, collate_fn_map=fn_map)


def _stack_tensors(batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
    elem = batch[0]
    if elem.is_nested or elem.layout != torch.strided:
        return _collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return torch.stack(batch, 0)
