"""Snapshots: a DistDataset's shares written in the store's own layout, restored with large
sequential reads on the same or another number of ranks.

A snapshot is a directory: ``manifest.json`` (format, version, name, sample count, schema, and
for every rank that wrote it its file, rows, size, whole-file CRC32 and, per field, where each
span lies and a CRC32 per block of whole rows) and ``rank-NNNNN.ddsnap`` (every field's rows back
to back; a ragged field as its values then its per-row lengths). Everything read back is
untrusted: the manifest is JSON of bounded size, files are opened without following symbolic
links and must be regular files of the recorded size, and every block is checked against its
CRC32 before a byte of it reaches the store. Files are written exclusively (O_EXCL, O_NOFOLLOW,
0600) under a temporary name and renamed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import zlib
from typing import Any, Callable

import numpy as np

from pyddstore import DDStoreError, DDStoreFileError, _json
from pyddstore._shares import share_of
from pyddstore._sources import ALIGN, AlignedReader, open_regular

from . import _load
from ._errors import SnapshotError, snapshot_error
from ._field import BOOL, FLOAT, INT, NDARRAY, NPSCALAR, RECORD, SUPPORTED_DTYPES, TENSOR, Field
from ._load_runner import LoadStats, Progress
from ._schema import (
    DICT,
    LIST,
    PYG_STRUCTURES,
    TUPLE,
    VALUE,
    Schema,
)

FORMAT = "pyddstore-snapshot"
VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20
BLOCK_BYTES = 1 << 20  # rows per checksum block: about this many bytes
READ_BYTES = 8 << 20  # one read while restoring: whole blocks, about this many bytes
_FILE_RE = re.compile(r"^rank-[0-9]{5}\.ddsnap$")


def file_name(rank: int) -> str:
    return f"rank-{rank:05d}.ddsnap"


# -- writing --------------------------------------------------------------------------------------


def _create_exclusive(path: str) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        raise SnapshotError(f"{path} already exists") from None
    except OSError as e:
        raise snapshot_error(f"{path} cannot be created ({e.strerror})", e.errno) from None


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        n = os.write(fd, data)
        data = data[n:]


class _SpanWriter:
    """Writes one rank's file sequentially: spans start 4 KiB-aligned (for O_DIRECT reads) and
    carry a CRC32 per block of whole items; a running CRC32 covers the whole file."""

    def __init__(self, fd: int):
        self.fd = fd
        self.pos = 0
        self.crc = 0

    def _put(self, data: memoryview) -> None:
        _write_all(self.fd, data)
        self.crc = zlib.crc32(data, self.crc)
        self.pos += len(data)

    def begin(self, items: int, item_bytes: int) -> dict:
        pad = -self.pos % ALIGN
        if pad:
            self._put(memoryview(bytes(pad)))
        block = max(1, BLOCK_BYTES // max(1, item_bytes))
        self._span = {
            "offset": self.pos,
            "items": items,
            "item_bytes": item_bytes,
            "block_items": block,
            "crc": [],
        }
        self._pending = bytearray()
        return self._span

    def write(self, data: np.ndarray) -> None:
        mv = memoryview(np.ascontiguousarray(data)).cast("B")
        self._put(mv)
        bb = self._span["block_items"] * self._span["item_bytes"]
        pending = self._pending
        pos = 0
        if pending:
            take = min(bb - len(pending), len(mv))
            pending += mv[:take]
            pos = take
            if len(pending) == bb:
                self._span["crc"].append(zlib.crc32(pending))
                pending.clear()
        while len(mv) - pos >= bb:
            self._span["crc"].append(zlib.crc32(mv[pos : pos + bb]))
            pos += bb
        pending += mv[pos:]

    def end(self) -> dict:
        if self._pending:
            self._span["crc"].append(zlib.crc32(self._pending))
        span, self._span = self._span, None
        want = -(-span["items"] // span["block_items"])
        if len(span["crc"]) != want or self.pos - span["offset"] != span["items"] * span["item_bytes"]:
            raise DDStoreError(
                f"snapshot span written inconsistently ({len(span['crc'])} blocks, want {want})"
            )
        return span


def write_rank_file(ds: Any, directory: str, start: int, count: int) -> dict:
    """This rank's share of every field into directory/rank-NNNNN.ddsnap (exclusive, renamed
    into place); returns its manifest entry."""
    store, schema = ds.ddstore, ds.schema
    final = os.path.join(directory, file_name(store.rank))
    tmp = os.path.join(directory, f".{file_name(store.rank)}.{os.getpid()}.tmp")
    fd = _create_exclusive(tmp)
    ok = False
    try:
        w = _SpanWriter(fd)
        fields = []
        for f in schema.fields:
            if f.is_ragged:
                fields.append(_write_ragged(ds, f, w, start, count))
            else:
                w.begin(count, f.row_bytes)
                step = max(1, READ_BYTES // max(1, f.row_bytes))
                for a in range(start, start + count, step):
                    rows = np.arange(a, min(start + count, a + step), dtype=np.int64)
                    buf = f.alloc(len(rows))
                    ds._read_into(f, buf, rows)
                    w.write(buf)
                fields.append({"rows": w.end()})
        os.fsync(fd)
        size = w.pos
        crc = w.crc
        os.close(fd)
        fd = -1
        if os.path.lexists(final):
            raise SnapshotError(f"{final} already exists")
        os.rename(tmp, final)
        ok = True
    finally:
        if fd >= 0:
            os.close(fd)
        if not ok:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
    return {
        "file": file_name(store.rank),
        "start": start,
        "count": count,
        "size": size,
        "crc32": crc,
        "fields": fields,
    }


def _write_ragged(ds: Any, f: Field, w: _SpanWriter, start: int, count: int) -> dict:
    store = ds.ddstore
    unit_bytes = f.unit_count * f.dtype.itemsize
    step = max(1, READ_BYTES // max(1, f.max_len * unit_bytes))
    lengths = np.zeros(count, np.int64)
    units = 0
    # First pass: the lengths (small); the values span needs its item count up front.
    for a in range(start, start + count, step):
        rows = np.arange(a, min(start + count, a + step), dtype=np.int64)
        _, offsets = store._get_ragged_flat(f.var, rows)
        lengths[a - start : a - start + len(rows)] = np.diff(offsets)
    units = int(lengths.sum())
    values = w.begin(units, unit_bytes)
    for a in range(start, start + count, step):
        rows = np.arange(a, min(start + count, a + step), dtype=np.int64)
        flat, _ = store._get_ragged_flat(f.var, rows)
        w.write(flat)
    values = w.end()
    w.begin(count, 8)
    w.write(lengths)
    return {"values": values, "lengths": w.end()}


def write_manifest(directory: str, name: str, n: int, schema: Schema, ranks: list[dict]) -> None:
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "num_samples": n,
        "schema": schema.to_json(),
        "ranks": ranks,
    }
    data = json.dumps(manifest).encode()
    final = os.path.join(directory, MANIFEST)
    tmp = os.path.join(directory, f".{MANIFEST}.{os.getpid()}.tmp")
    fd = _create_exclusive(tmp)
    try:
        _write_all(fd, memoryview(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    if os.path.lexists(final):
        os.unlink(tmp)
        raise SnapshotError(f"{final} already exists")
    os.rename(tmp, final)


def prepare_directory(path: str) -> None:
    """Rank 0: creates the snapshot directory (0700) or accepts an existing one without a
    manifest."""
    if os.path.lexists(os.path.join(path, MANIFEST)):
        raise SnapshotError(f"{path} already holds a snapshot ({MANIFEST}); choose a new directory")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        what = f"{path}: cannot create the snapshot directory ({e.strerror})"
        raise snapshot_error(what, e.errno) from None
    if os.path.islink(path) or not os.path.isdir(path):
        raise SnapshotError(f"{path} is not a directory")


# -- reading --------------------------------------------------------------------------------------


def read_manifest(path: str) -> tuple[dict, str]:
    """The manifest of the snapshot in directory path, checked; and its SHA-256."""
    mpath = os.path.join(path, MANIFEST)
    fd, _ = _open_snapshot_file(mpath, False)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_MANIFEST_BYTES:
            raise SnapshotError(
                f"{mpath}: {size} bytes is more than a manifest may hold ({MAX_MANIFEST_BYTES})"
            )
        raw = os.pread(fd, size + 1, 0)
    finally:
        os.close(fd)
    if len(raw) != size:
        raise SnapshotError(f"{mpath} changed while it was read")
    m = _json.loads(raw, f"snapshot manifest {mpath}", SnapshotError, MAX_MANIFEST_BYTES)
    _check_manifest(m, mpath)
    return m, hashlib.sha256(raw).hexdigest()


def _open_snapshot_file(path: str, direct: bool) -> tuple[int, bool]:
    try:
        return open_regular(path, direct, nofollow=True)
    except DDStoreFileError as e:
        raise snapshot_error(str(e), e.errno) from None


def _is_int(v: Any, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < 2**62


def _check_span(span: Any, items: int, item_bytes: int, size: int, where: str) -> None:
    if not isinstance(span, dict):
        raise SnapshotError(f"{where}: span is not an object")
    for k in ("offset", "items", "item_bytes", "block_items"):
        if not _is_int(span.get(k)):
            raise SnapshotError(f"{where}: {k} must be a non-negative integer, got {span.get(k)!r}")
    if span["items"] != items or span["item_bytes"] != item_bytes or span["block_items"] < 1:
        raise SnapshotError(
            f"{where}: {span['items']} items of {span['item_bytes']} bytes, expected {items} of {item_bytes}"
        )
    if span["offset"] + items * item_bytes > size:
        end = span["offset"] + items * item_bytes
        raise SnapshotError(f"{where}: bytes {span['offset']}..{end} lie beyond the file's {size}")
    crc = span.get("crc")
    want = -(-items // span["block_items"])
    if not isinstance(crc, list) or len(crc) != want or not all(_is_int(c) for c in crc):
        raise SnapshotError(f"{where}: expected {want} block checksums")


def _check_manifest(m: Any, mpath: str) -> None:
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise SnapshotError(f"{mpath} is not a pyddstore snapshot manifest")
    if m.get("version") != VERSION or isinstance(m.get("version"), bool):
        raise SnapshotError(f"{mpath}: version {m.get('version')!r}, this pyddstore reads version {VERSION}")
    if not isinstance(m.get("name"), str) or not _is_int(m.get("num_samples")):
        raise SnapshotError(f"{mpath}: name / num_samples malformed")
    try:
        schema = Schema.from_json(m["schema"])
    except Exception as e:  # noqa: BLE001 - any malformed field description
        raise SnapshotError(f"{mpath}: the schema is malformed ({type(e).__name__}: {e})") from None
    _check_schema(schema, mpath)
    ranks = m.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise SnapshotError(f"{mpath}: no rank files listed")
    pos = 0
    for r, entry in enumerate(ranks):
        where = f"{mpath}: rank {r}"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("file"), str)
            or not _FILE_RE.match(entry["file"])
        ):
            raise SnapshotError(f"{where}: file name missing or not of the form rank-NNNNN.ddsnap")
        for k in ("start", "count", "size", "crc32"):
            if not _is_int(entry.get(k)):
                raise SnapshotError(f"{where}: {k} must be a non-negative integer")
        if entry["start"] != pos:
            raise SnapshotError(f"{where}: starts at row {entry['start']}, expected {pos}")
        pos += entry["count"]
        fields = entry.get("fields")
        if not isinstance(fields, list) or len(fields) != len(schema.fields):
            raise SnapshotError(f"{where}: expected {len(schema.fields)} fields")
        for f, fe in zip(schema.fields, fields):
            fwhere = f"{where} ({entry['file']}), field {f.key!r}"
            if not isinstance(fe, dict):
                raise SnapshotError(f"{fwhere}: malformed")
            if f.is_ragged:
                _check_span(fe.get("lengths"), entry["count"], 8, entry["size"], fwhere + " lengths")
                values = fe.get("values")
                items = values.get("items") if isinstance(values, dict) else None
                if not _is_int(items):
                    raise SnapshotError(f"{fwhere} values: items malformed")
                _check_span(values, items, f.unit_count * f.dtype.itemsize, entry["size"], fwhere + " values")
            else:
                _check_span(fe.get("rows"), entry["count"], f.row_bytes, entry["size"], fwhere)
    if pos != m["num_samples"]:
        raise SnapshotError(f"{mpath}: the rank files hold {pos} rows, num_samples is {m['num_samples']}")


def _check_schema(schema: Schema, mpath: str) -> None:
    """Only what the store can hold: known kinds and structures, supported native dtypes,
    records without Python objects, non-negative dimensions (-1 on the ragged axis only)."""
    if schema.structure not in (VALUE, TUPLE, LIST, DICT, *PYG_STRUCTURES) or not schema.fields:
        raise SnapshotError(f"{mpath}: sample structure {schema.structure!r} is not one pyddstore writes")
    for f in schema.fields:
        where = f"{mpath}: field {f.key!r}"
        if not isinstance(f.key, (str, int)) or isinstance(f.key, bool):
            raise SnapshotError(f"{where}: keys are strings or integers")
        if f.kind not in (TENSOR, NDARRAY, NPSCALAR, INT, FLOAT, BOOL, RECORD):
            raise SnapshotError(f"{where}: kind {f.kind!r} is not one pyddstore writes")
        if f.is_record:
            if f.dtype.names is None or f.dtype.hasobject:
                raise SnapshotError(f"{where}: record dtype {f.dtype} is not a plain structured dtype")
        elif f.dtype.name not in SUPPORTED_DTYPES or not f.dtype.isnative:
            raise SnapshotError(f"{where}: dtype {f.dtype.str} is not one the store holds")
        dims_ok = all(
            isinstance(d, int) and not isinstance(d, bool) and (d >= 0 or (d == -1 and i == f.ragged))
            for i, d in enumerate(f.shape)
        )
        if not dims_ok or (f.is_ragged and f.shape[f.ragged] != -1) or f.row_bytes > 2**40:
            raise SnapshotError(f"{where}: shape {f.shape} is malformed")


class _Files:
    """The snapshot's rank files this rank reads, opened once (no symbolic links, regular
    files of the manifest's size), shared by the reading threads (positional reads)."""

    def __init__(self, directory: str, direct: bool):
        self.directory = directory
        self.direct = direct
        self.fds: dict[str, tuple[int, bool]] = {}

    def get(self, entry: dict) -> tuple[int, bool, str]:
        path = os.path.join(self.directory, entry["file"])
        if path not in self.fds:
            fd, direct = _open_snapshot_file(path, self.direct)
            size = os.fstat(fd).st_size
            if size != entry["size"]:
                os.close(fd)
                what = "truncated" if size < entry["size"] else "longer than recorded"
                raise SnapshotError(f"{path} is {what}: {size} bytes, the manifest says {entry['size']}")
            self.fds[path] = (fd, direct)
        fd, direct = self.fds[path]
        return fd, direct, path

    def close(self) -> None:
        for fd, _ in self.fds.values():
            os.close(fd)
        self.fds = {}


def _read_blocks(reader: AlignedReader, files: _Files, entry: dict, span: dict, b0: int, b1: int, what: str):
    """Blocks [b0, b1) of a span, checked: (first item, uint8 view of their bytes)."""
    fd, direct, path = files.get(entry)
    bi, ib = span["block_items"], span["item_bytes"]
    first, last = b0 * bi, min(span["items"], b1 * bi)
    data = reader.read(fd, direct, span["offset"] + first * ib, (last - first) * ib, path)
    for b in range(b0, b1):
        a = (b * bi - first) * ib
        z = (min(span["items"], (b + 1) * bi) - first) * ib
        if zlib.crc32(data[a:z]) != span["crc"][b]:
            at = span["offset"] + first * ib
            raise SnapshotError(
                f"{path}: checksum mismatch in {what}, block {b} (bytes {at + a}..{at + z}): "
                "the snapshot is corrupt"
            )
    return first, data


def _overlaps(manifest: dict, start: int, count: int):
    for entry in manifest["ranks"]:
        lo, hi = max(start, entry["start"]), min(start + count, entry["start"] + entry["count"])
        if lo < hi:
            yield entry, lo, hi


def restore_share(
    manifest: dict,
    directory: str,
    schema: Schema,
    start: int,
    count: int,
    native_for: Callable[[Field], Callable[..., tuple[int, bool]]],
    depth: int,
    direct: bool,
    stats: LoadStats,
    progress: Progress,
) -> dict:
    """Rows [start, start + count) of every field from the snapshot, read in Rust straight
    into the share (`native_for(field)` is the variable's load_file_ranges), one read per
    checksum block, `depth` in flight, every block verified before the load succeeds. Fixed
    fields are read now; ragged fields' lengths are read (and checked) now and their values
    once their variable exists: returns {key: _RaggedRestore}."""
    stats.path = "snapshot (native)"
    for f in schema.fixed_fields:
        k = schema.fields.index(f)
        paths, sizes, tables = [], [], []
        for entry, lo, hi in _overlaps(manifest, start, count):
            e0 = entry["start"]
            tables.append(_block_table(entry["fields"][k]["rows"], len(paths), lo - e0, hi - e0, lo - start))
            paths.append(os.path.join(directory, entry["file"]))
            sizes.append(entry["size"])
        if tables:
            _native_read(native_for(f), paths, sizes, np.concatenate(tables), depth, direct, stats, progress)
    return {
        f.key: _RaggedRestore(
            manifest, directory, f, schema.fields.index(f), start, count, depth, direct, stats, progress
        )
        for f in schema.ragged_fields
    }


def _block_table(span: dict, fidx: int, lo: int, hi: int, dst_first: int) -> np.ndarray:
    """Native ranges (see _load.R_*) reading items [lo, hi) of a span one checksum block at a
    time, each block read and checked whole; item lo lands at item dst_first of the share."""
    bi, ib = span["block_items"], span["item_bytes"]
    b0, b1 = lo // bi, -(-hi // bi)
    first = np.arange(b0, b1, dtype=np.int64) * bi
    last = np.minimum(span["items"], first + bi)
    a = np.maximum(first, lo)
    z = np.minimum(last, hi)
    t = np.empty((len(first), 7), np.int64)
    t[:, _load.R_FILE] = fidx
    t[:, _load.R_OFF] = span["offset"] + first * ib
    t[:, _load.R_LEN] = (last - first) * ib
    t[:, _load.R_CRC] = np.asarray(span["crc"][b0:b1], np.int64)
    t[:, _load.R_SKIP] = (a - first) * ib
    t[:, _load.R_WLEN] = (z - a) * ib
    t[:, _load.R_DST] = (a - lo + dst_first) * ib
    return t


def _native_read(fill, paths, sizes, table, depth, direct, stats, progress) -> None:
    stats.workers = max(stats.workers, min(depth, max(1, len(table))))
    _load.load_ranges_native(
        fill, paths, table, depth, direct, stats, progress, error=SnapshotError, nofollow=True, sizes=sizes
    )


class _RaggedRestore:
    """A ragged field of a snapshot: the lengths of this rank's rows read (and checked) up
    front; `write` reads the values straight into the ragged variable once it exists (every
    block checked in Rust), so the values are never held twice."""

    def __init__(self, manifest, directory, f, k, start, count, depth, direct, stats, progress):
        self.depth, self.direct, self.stats, self.progress = depth, direct, stats, progress
        self.lengths = np.zeros(count, np.int64)
        self.paths, self.sizes, tables = [], [], []
        files = _Files(directory, False)
        reader = AlignedReader()
        dst_first = 0
        try:
            for entry, lo, hi in _overlaps(manifest, start, count):
                fe = entry["fields"][k]
                span = fe["lengths"]
                _, data = _read_blocks(
                    reader, files, entry, span, 0, len(span["crc"]), f"field {f.key!r} lengths"
                )
                lens = np.frombuffer(data, np.int64).copy()
                del data
                path = os.path.join(directory, entry["file"])
                if (lens < 0).any() or int(lens.sum()) != fe["values"]["items"]:
                    raise SnapshotError(
                        f"{path}: field {f.key!r}: lengths do not add up to the "
                        f"{fe['values']['items']} values recorded"
                    )
                if f.max_len and len(lens) and int(lens.max()) > f.max_len:
                    raise SnapshotError(f"{path}: field {f.key!r}: a row is longer than max_len {f.max_len}")
                ends = np.concatenate([[0], np.cumsum(lens)])
                e0 = entry["start"]
                u0, u1 = int(ends[lo - e0]), int(ends[hi - e0])
                self.lengths[lo - start : hi - start] = lens[lo - e0 : hi - e0]
                if u1 > u0:
                    tables.append(_block_table(fe["values"], len(self.paths), u0, u1, dst_first))
                    self.paths.append(path)
                    self.sizes.append(entry["size"])
                dst_first += u1 - u0
        finally:
            reader.close()
            files.close()
        self.table = np.concatenate(tables) if tables else np.empty((0, 7), np.int64)

    def write(self, store: Any, values_var: str) -> None:
        """Reads the values into `values_var` (this rank's share of the ragged variable)."""
        if len(self.table):
            fill = functools.partial(store.load_file_ranges, values_var)
            _native_read(
                fill, self.paths, self.sizes, self.table, self.depth, self.direct, self.stats, self.progress
            )


def check_restorable(manifest: dict, path: str, name: str | None) -> str:
    """The dataset's name (name= may rename it)."""
    if name is not None and (not isinstance(name, str) or not name):
        raise SnapshotError(f"name must be a non-empty string, got {name!r}")
    return name or manifest["name"]


def share_of_snapshot(manifest: dict, size: int, rank: int) -> tuple[int, int]:
    return share_of(manifest["num_samples"], size, rank)
