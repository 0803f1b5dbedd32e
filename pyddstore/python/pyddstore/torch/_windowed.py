"""WindowedDataset: samples made of several stored rows (time windows, clips), and row_of."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset

from pyddstore import DDStoreIndexError, DDStoreKeyError, DDStoreTypeError, DDStoreValueError

from ._field import RaggedRows


def window_starts(
    n_rows: int, window: int, stride: int = 1, dilation: int = 1, starts: Any = None
) -> np.ndarray:
    """First row of every window: i*stride for every window that fits, or the given starts
    (each checked to fit: DDStoreIndexError, an IndexError, naming the window and its rows)."""
    for label, v in (("window", window), ("stride", stride), ("dilation", dilation)):
        if int(v) != v or v < 1:
            raise DDStoreValueError(f"{label} must be a positive integer, got {v!r}")
    span = (window - 1) * dilation  # last row minus first row
    if starts is None:
        if n_rows <= span:
            return np.zeros(0, dtype=np.int64)
        return np.arange(0, n_rows - span, stride, dtype=np.int64)
    s = np.asarray(starts)
    if s.ndim != 1 or (s.size and s.dtype.kind not in "iu"):
        raise DDStoreValueError("starts must be a 1-D sequence of integers")
    s = s.astype(np.int64)
    bad = (s < 0) | (s + span >= n_rows)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        b = int(s[i])
        raise DDStoreIndexError(
            f"starts[{i}] = {b}: the window of {window} rows (dilation {dilation}) starting there "
            f"needs rows {b}..{b + span}, which does not fit in {n_rows} stored rows (rows 0..{n_rows - 1})"
        )
    return s


def window_rows(starts: np.ndarray, window: int, dilation: int) -> np.ndarray:
    """(len(starts), window) stored rows of the windows starting at starts."""
    return starts[:, None] + np.arange(window, dtype=np.int64)[None, :] * dilation


class WindowedDataset(Dataset):
    """Samples of several stored rows of a DistDataset / DistDatasetReader, each row stored once.

    Sample i holds rows s, s+dilation, ..., s+(window-1)*dilation with s = i*stride or
    starts[i]. Fields are stacked to (window, *field_shape) (a ragged field: a list of the
    window's rows) and arranged like the stored samples,
    or, with fields=[...], as a dict keyed by field (as upstream). decode= is not applied. A
    batch (__getitems__) is one read_rows(). A start whose window does not fit in the stored
    rows raises DDStoreIndexError (an IndexError) naming the window, its rows and the row count.

    Args:
        ds (DistDataset | DistDatasetReader): the stored rows.
        window (int): rows per sample.
        stride (int): sample i starts at row i * stride (without `starts`).
        dilation (int): distance between a sample's rows.
        starts (Sequence[int] | None): the first row of each sample, instead of `stride`.
        fields (Sequence[str | int] | None): give dicts of these fields (upstream's layout) instead of the
            stored structure.

    Example:
        ```python
        frames = DistDataset(steps, "frames", comm, method=1)  # one sample per time step
        pairs = WindowedDataset(frames, window=3, dilation=dt)  # rows (t, t+dt, t+2dt)
        x = pairs[0][0]  # shape (3, *frame_shape)
        ```
    """

    def __init__(
        self, ds: Any, window: int, stride: int = 1, dilation: int = 1, starts: Any = None, fields: Any = None
    ):
        super().__init__()
        if not hasattr(ds, "read_rows"):
            raise DDStoreTypeError("WindowedDataset needs a DistDataset or DistDatasetReader")
        self.ds = ds
        self.window = int(window)
        self.stride = int(stride)
        self.dilation = int(dilation)
        self.starts = window_starts(len(ds), window, stride, dilation, starts)
        schema = ds.schema
        keys = list(schema.keys) if fields is None else list(fields)
        for k in keys:
            if k not in schema.by_key:
                raise DDStoreKeyError(f"no stored field {k!r}; stored fields: {schema.keys!r}")
        self.fields = keys
        structure = schema.structure if fields is None else "dict"
        seq_type = schema.seq_type if fields is None else dict
        self._schema = type(schema)(structure, [schema.by_key[k] for k in keys], keys, seq_type)
        self._offsets = np.arange(self.window, dtype=np.int64) * self.dilation

    def __len__(self) -> int:
        return len(self.starts)

    def rows(self, index: int) -> np.ndarray:
        """The stored rows of sample index.

        Args:
            index (int): a sample of this dataset.
        """
        i = int(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise DDStoreIndexError(f"index {index} is out of range for {len(self)} windows")
        return self.starts[i] + self._offsets

    def __getitem__(self, index: Any) -> Any:
        values = self.ds.read_rows(self.rows(index), fields=self.fields)
        return self._schema.arrange({k: _rows_list(v) for k, v in values.items()})

    def __getitems__(self, indices: Any) -> list:
        idx = np.asarray([int(i) for i in indices], dtype=np.int64)
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise DDStoreIndexError(f"an index of {list(indices)} is out of range for {n} windows")
        rows = window_rows(self.starts[idx], self.window, self.dilation)
        values = self.ds.read_rows(rows.reshape(-1), fields=self.fields)
        b = len(idx)
        columns = {}
        for k, v in values.items():
            if isinstance(v, RaggedRows):  # rows of different sizes: a list of rows per window
                rows_ = _rows_list(v)
                columns[k] = [rows_[j * self.window : (j + 1) * self.window] for j in range(b)]
                continue
            shaped = v.reshape(b, self.window, *v.shape[1:])
            columns[k] = list(shaped.unbind(0)) if isinstance(shaped, torch.Tensor) else list(shaped)
        return self._schema.build(columns, b)


def _rows_list(v: Any) -> Any:
    """A ragged field's rows as a list (they cannot be stacked); other fields unchanged."""
    if isinstance(v, RaggedRows):
        return [v.row(i) for i in range(len(v))]
    return v


def row_of(concat: ConcatDataset, source: int, index: int) -> int:
    """In a DistDataset over a ConcatDataset, the stored row of sample index of dataset source.

    Args:
        concat (ConcatDataset): the DistDataset's source.
        source (int): which of its datasets.
        index (int): a sample of that dataset (0 <= index < its length).

    Example:
        ```python
        files = ConcatDataset([StepsOf(f) for f in paths])
        starts = [row_of(files, k, t) for k in range(len(paths))
                  for t in range(len(files.datasets[k]) - 2 * dt)]  # windows inside each file
        ```
    """
    n_sources = len(concat.datasets)
    if source < 0:
        source += n_sources
    if not 0 <= source < n_sources:
        raise DDStoreIndexError(f"source {source} is out of range for {n_sources} datasets")
    size = len(concat.datasets[source])
    # Unlike Python indexing, -1 is not the last sample: a window start computed
    # as a negative number must fail, not land silently at the end of another file.
    if not 0 <= index < size:
        raise DDStoreIndexError(f"index {index} is out of range for dataset {source} of {size} samples")
    return (concat.cumulative_sizes[source - 1] if source > 0 else 0) + index
