"""Loading with forked worker processes: sources that are not thread-safe (or whose decoding
holds the GIL), and compressed h5py datasets (whose reads hold a lock).

The children fill a shared staging area of whole rows, round after round, and this process
copies each round into the share; children never touch the store. Each child answers every
round through a pipe ("ok" or its error as data, see _agree.error_payload), writes a dot per
finished item (its sign of life), and is killed and named when it finishes nothing for
DDSTORE_LOAD_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import select
import signal
import sys
import time
from typing import Any, Callable

import numpy as np

from pyddstore import DDStoreError, DDStoreTimeoutError

from . import _load_runner
from ._agree import error_payload, rebuild_error
from ._field import Field
from ._load_runner import LoadStats, Progress
from ._schema import ChunkFiller, Schema, sample_of


class DDStoreChildError(DDStoreError, RuntimeError):
    """A forked load worker died (killed, out of memory) before answering."""


def _staging_filler(schema: Schema, staging: Any, rows: int) -> ChunkFiller:
    """A ChunkFiller whose row buffers are views of the shared staging mapping: each field's
    rows in value layout, one field after another."""
    filler = ChunkFiller(schema, 0)
    bufs, pos = [], 0
    for f in schema.fixed_fields:
        n = rows * f.row_bytes
        bufs.append(np.frombuffer(staging, np.uint8, n, pos).view(f.dtype).reshape(rows, *f.shape))
        pos += n
    filler.bufs = bufs
    return filler


def _child_loop(rfd: int, wfd: int, w: int, workers: int, source, schema, encode, start, filler) -> None:
    """A forked worker: for every chunk [a, b) the parent sends, fills rows a + w, a + w +
    workers, ... of the staging area, writing "." after each sample (the parent's deadline
    counts from the last sign of life); then a line: "ok" or the error (JSON: kind, message)."""
    with os.fdopen(rfd, "r") as cmds:
        for line in cmds:
            a, b = (int(x) for x in line.split())

            def fill(a=a, b=b) -> None:
                for j in range(a + w, b, workers):
                    i = start + j
                    filler.put(j - a, sample_of(source, i, encode), i)
                    os.write(wfd, b".")

            _answer(wfd, fill)


def _answer(wfd: int, work: Callable[[], None]) -> None:
    """A child's round: runs work(), then sends its answer line, "ok" or the error as data
    (error_payload, rank -1: a load worker)."""
    try:
        work()
        answer = b"ok\n"
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        answer = (json.dumps(list(error_payload(e, -1))) + "\n").encode()
    while answer:
        answer = answer[os.write(wfd, answer) :]


def load_timeout(settings) -> float:
    """DDSTORE_LOAD_TIMEOUT_S of `settings` (a store's): how long a forked load worker may
    work on one sample."""
    return settings.load_timeout_s


def _await_children(children, timeout: float, stuck: Callable[[int, int], str]) -> list:
    """Each child's answer to the chunk just sent (bytes without the dots; b"" if it died). A
    child silent for `timeout` seconds (no sample or slice finished) raises DDStoreTimeoutError
    with stuck(child, items it finished) in its message."""
    fds = {pr.fileno(): k for k, (_, _, pr) in enumerate(children)}
    bufs = {k: bytearray() for k in fds.values()}
    dots = dict.fromkeys(fds.values(), 0)
    last = dict.fromkeys(fds.values(), time.monotonic())
    answers: list = [None] * len(children)
    pending = set(fds)
    while pending:
        now = time.monotonic()
        wait = min(last[fds[fd]] + timeout for fd in pending) - now
        ready, _, _ = select.select(list(pending), [], [], max(0.0, min(wait, 5.0)))
        now = time.monotonic()
        for fd in ready:
            k = fds[fd]
            data = os.read(fd, 1 << 16)
            last[k] = now
            if not data:
                answers[k] = b""
                pending.discard(fd)
                continue
            buf = bufs[k]
            buf += data
            n = len(buf) - len(buf.lstrip(b"."))
            dots[k] += n
            del buf[:n]
            if buf.endswith(b"\n"):
                answers[k] = bytes(buf).strip()
                pending.discard(fd)
        for fd in list(pending):
            k = fds[fd]
            if now - last[k] >= timeout:
                raise DDStoreTimeoutError(
                    f"load worker process {children[k][0]} has not finished {stuck(k, dots[k])} "
                    f"within {timeout:g} s (DDSTORE_LOAD_TIMEOUT_S)"
                )
    return answers


def _fork_children(workers: int, child: Callable[[int, int, int], None]) -> list:
    """Forks `workers` processes, each running child(w, command fd, answer fd) then os._exit;
    returns [(pid, command writer, answer reader)]."""
    children: list = []
    sys.stdout.flush()
    sys.stderr.flush()
    for w in range(workers):
        c_r, p_w = os.pipe()
        p_r, c_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            code = 0
            try:
                os.close(p_w)
                os.close(p_r)
                for _, pw, pr in children:
                    pw.close()
                    pr.close()
                child(w, c_r, c_w)
            except BaseException:  # noqa: BLE001 - the parent sees the pipe close
                code = 1
            finally:
                os._exit(code)
        os.close(c_r)
        os.close(c_w)
        children.append((pid, os.fdopen(p_w, "w"), os.fdopen(p_r, "r")))
    return children


def _end_children(children: list, finished: bool) -> None:
    """Closes the pipes (each child's loop ends) and reaps the children; after a failure they
    are killed first (one may be stuck in a read and never see its pipe close)."""
    for pid, pw, pr in children:
        if not finished:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pw.close()
        pr.close()
    for pid, _, _ in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _child_error(pid: int, answer: bytes, what: str) -> Exception | None:
    """The error a child's answer reports (None for "ok")."""
    if not answer:
        return DDStoreChildError(f"load worker process {pid} died while loading {what}")
    if answer == b"ok":
        return None
    kind, msg, *errno = json.loads(answer)
    if kind == "other":
        return DDStoreError(f"a load worker process failed: {msg.replace('rank -1: ', '', 1)}")
    return rebuild_error((kind, msg, *errno))


def load_sliced_forked(
    reopen: Callable[[], Any],
    f: Field,
    bounds: list[tuple[int, int]],
    start: int,
    put: Callable[[Field, np.ndarray, int], None],
    convert: Callable[[Any, int, int], np.ndarray],
    workers: int,
    stats: LoadStats,
    progress: Progress,
    timeout: float,
    held: int = _load_runner.HELD_MAX_BYTES,
) -> None:
    """Slices `bounds` of an array whose reads hold a lock (a compressed h5py dataset:
    decompression runs one slice at a time in one process) read by `workers` forked processes,
    each with its own handle (`reopen()` in the child), into a shared staging area of whole rows
    (~10% of the share, at least 16 MiB, at most `held` bytes but a slice per worker), round
    after round; this process copies each round into the share. Children never touch the
    store; a child that finishes no slice within `timeout` seconds (the store's
    DDSTORE_LOAD_TIMEOUT_S) is killed and named."""
    rb = max(1, f.row_bytes)
    total = sum(b - a for a, b in bounds)
    window = min(max(_load_runner.MIN_WINDOW_BYTES, total * rb // 10), held)
    limit = max(window, max((b - a) * rb for a, b in bounds) * workers)
    rounds: list[list[tuple[int, int]]] = [[]]
    used = 0
    for a, b in bounds:
        if rounds[-1] and used + (b - a) * rb > limit:
            rounds.append([])
            used = 0
        rounds[-1].append((a, b))
        used += (b - a) * rb
    staging = mmap.mmap(-1, max(1, limit))
    stats.window_bytes = limit

    def child(w: int, rfd: int, wfd: int) -> None:
        arr = reopen()  # this process's own handle
        dst = np.frombuffer(staging, np.uint8)
        with os.fdopen(rfd, "r") as cmds:
            for line in cmds:
                k0, k1 = (int(x) for x in line.split())
                base = rounds[k0][0][0]

                def fill(k0=k0, base=base) -> None:
                    for a, b in rounds[k0][w::workers]:
                        rows = np.ascontiguousarray(convert(arr, a, b))
                        if rows.nbytes != (b - a) * rb:
                            raise DDStoreError(f"rows {a}..{b}: {rows.nbytes} bytes, expected {(b - a) * rb}")
                        dst[(a - base) * rb : (b - base) * rb] = rows.reshape(-1).view(np.uint8)
                        os.write(wfd, b".")

                _answer(wfd, fill)

    children: list = []
    finished = False
    try:
        children = _fork_children(workers, child)
        for k, slices in enumerate(rounds):
            a0, b0 = slices[0][0], slices[-1][1]
            t0 = time.perf_counter()
            for _, pw, _ in children:
                pw.write(f"{k} {k + 1}\n")
                pw.flush()

            def stuck(w: int, done: int, slices=slices) -> str:
                a, b = slices[w::workers][min(done, len(slices[w::workers]) - 1)]
                return f"rows {a}..{b} of {f.key!r} (is the file system stuck?)"

            answers = _await_children(children, timeout, stuck)
            for (pid, _, _), answer in zip(children, answers):
                err = _child_error(pid, answer, f"rows {a0}..{b0}")
                if err is not None:
                    raise err
            t1 = time.perf_counter()
            n = b0 - a0
            rows = np.frombuffer(staging, f.store_dtype, n * rb // f.store_dtype.itemsize)
            put(f, rows.reshape(n, *f.store_shape), a0 - start)
            del rows
            stats.add(n * rb, (t1 - t0) * workers, time.perf_counter() - t1)
            progress.update(n * rb)
        finished = True
    finally:
        _end_children(children, finished)
        with contextlib.suppress(BufferError):
            staging.close()


def load_samples_forked(
    source: Any,
    schema: Schema,
    encode: Any,
    start: int,
    count: int,
    put: Callable[[Field, np.ndarray, int], None],
    workers: int,
    stats: LoadStats,
    progress: Progress,
    timeout: float,
    held: int = _load_runner.HELD_MAX_BYTES,
) -> None:
    """Map-style sources that are not thread-safe (or whose decoding holds the GIL): `workers`
    forked processes fill a shared staging area of whole rows (~10% of the share, at least
    16 MiB, at most `held` bytes: load_held_bytes; one row per worker at least), chunk after
    chunk, and this process copies each chunk into the share.
    Children never touch the store; each sends "ok" or its error through a pipe, and a child
    that dies is seen as the pipe's end; one that finishes no sample within `timeout` seconds
    (the store's DDSTORE_LOAD_TIMEOUT_S) is killed and named."""
    row_bytes = max(1, sum(f.row_bytes for f in schema.fixed_fields))
    window = min(max(_load_runner.MIN_WINDOW_BYTES, count * row_bytes // 10), held)
    rows = max(workers, min(count, window // row_bytes))
    stats.window_bytes = rows * row_bytes
    staging = mmap.mmap(-1, max(1, rows * row_bytes))  # MAP_SHARED|MAP_ANONYMOUS: seen by the children
    filler = _staging_filler(schema, staging, rows)
    children: list = []
    finished = False
    try:
        children = _fork_children(
            workers,
            lambda w, rfd, wfd: _child_loop(rfd, wfd, w, workers, source, schema, encode, start, filler),
        )
        for a in range(0, count, rows):
            b = min(count, a + rows)
            t0 = time.perf_counter()
            for _, pw, _ in children:
                pw.write(f"{a} {b}\n")
                pw.flush()

            def stuck(k: int, done: int, a=a, b=b) -> str:
                i = start + a + k + done * workers
                return (
                    f"sample {i} (this rank's samples {start + a}..{start + b} were loading): "
                    f"is source[{i}] stuck?"
                )

            answers = _await_children(children, timeout, stuck)
            error = None
            for (pid, _, _), answer in zip(children, answers):
                error = error or _child_error(pid, answer, f"rows {a}..{b}")
            if error is not None:
                raise error
            t1 = time.perf_counter()
            for f, view in zip(schema.fixed_fields, filler.store_views(b - a)):
                put(f, view, a)
            stats.add((b - a) * row_bytes, (t1 - t0) * workers, time.perf_counter() - t1)
            progress.update((b - a) * row_bytes)
        finished = True
    finally:
        _end_children(children, finished)
        filler.bufs = []
        try:
            staging.close()
        except BufferError:
            pass
