"""A file system that hangs on purpose: a small FUSE server speaking the kernel protocol on
/dev/fuse directly (no libfuse), mirroring the regular files of a backing directory read-only.

    python hangfs.py MOUNTPOINT BACKING_DIR SPEC_JSON

SPEC_JSON: {"hang": {"name": [lo, hi]}, "delay": {"name": seconds}}. A READ of `name` that
overlaps bytes [lo, hi) gets no reply (the reader sits in the kernel, as on a Lustre OST or
NFS server that is gone) until the server gets SIGUSR1, which answers every held READ with
the file's bytes. Every READ of a delayed file is answered `seconds` later (a slow file system
that still moves). Files are opened with FOPEN_DIRECT_IO, so every read() reaches the server
with its own offset and length (no page cache, no readahead).

Prints "ready" once mounted (or "error: ..." and exits 1). Runs until SIGTERM or until the
kernel ends the connection (unmount). It does not unmount: the test does (umount -l), in a
finally, after ending this process (which aborts any request still held).
"""

from __future__ import annotations

import ctypes
import errno
import heapq
import json
import os
import select
import signal
import stat
import struct
import sys
import time

# Opcodes (include/uapi/linux/fuse.h).
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 17, 18, 25, 26
OPENDIR, RELEASEDIR, INTERRUPT, DESTROY, BATCH_FORGET = 27, 29, 36, 38, 42
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}  # an INTERRUPT is ignored: the READ stays held
FOPEN_DIRECT_IO = 1
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ROOT = 1
TTL = 60


def attr(ino: int, size: int, mode: int) -> bytes:
    now = int(time.time())
    # ino size blocks atime mtime ctime (ns x3) mode nlink uid gid rdev blksize flags
    return struct.pack(
        "<QQQQQQIIIIIIIIII", ino, size, (size + 511) // 512, now, now, now, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0
    )


class Server:
    def __init__(self, fd: int, backing: str, spec: dict):
        self.fd = fd
        self.backing = backing
        self.names = sorted(n for n in os.listdir(backing) if os.path.isfile(os.path.join(backing, n)))
        self.hang = {k: tuple(v) for k, v in spec.get("hang", {}).items()}
        self.delay = dict(spec.get("delay", {}))
        self.held: list[tuple[int, str, int, int]] = []  # (unique, name, offset, size)
        self.later: list[tuple[float, int, bytes]] = []  # heap of (due, seq, reply)
        self.seq = 0
        self.release = False

    def name_of(self, ino: int) -> str | None:
        k = ino - 2
        return self.names[k] if 0 <= k < len(self.names) else None

    def attr_of(self, ino: int) -> bytes | None:
        if ino == ROOT:
            return attr(ROOT, 0, stat.S_IFDIR | 0o555)
        name = self.name_of(ino)
        if name is None:
            return None
        return attr(ino, os.path.getsize(os.path.join(self.backing, name)), stat.S_IFREG | 0o444)

    def send(self, unique: int, error: int = 0, body: bytes = b"") -> None:
        msg = OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body
        try:
            os.write(self.fd, msg)
        except OSError as e:
            # ENOENT: the request was interrupted and is gone; anything else ends the session.
            if e.errno != errno.ENOENT:
                raise

    def data(self, name: str, offset: int, size: int) -> bytes:
        with open(os.path.join(self.backing, name), "rb") as f:
            return os.pread(f.fileno(), size, offset)

    def handle(self, req: bytes) -> bool:
        _, op, unique, node, *_ = IN_HEADER.unpack_from(req)
        arg = req[IN_HEADER.size :]
        if op in NO_REPLY:
            return True
        if op == INIT:
            major, minor, readahead, flags = struct.unpack_from("<IIII", arg)
            # major minor max_readahead flags max_background congestion max_write time_gran
            # max_pages map_alignment flags2 max_stack_depth unused[6]
            body = struct.pack("<IIIIHHIIHHII24x", 7, 31, 0, 0, 16, 12, 1 << 20, 1, 32, 0, 0, 0)
            self.send(unique, 0, body)
        elif op == DESTROY:
            self.send(unique)
            return False
        elif op == LOOKUP:
            name = arg.split(b"\0", 1)[0].decode()
            if node != ROOT or name not in self.names:
                self.send(unique, errno.ENOENT)
            else:
                ino = self.names.index(name) + 2
                body = struct.pack("<QQQQII", ino, 0, TTL, TTL, 0, 0) + self.attr_of(ino)
                self.send(unique, 0, body)
        elif op == GETATTR:
            a = self.attr_of(node)
            if a is None:
                self.send(unique, errno.ENOENT)
            else:
                self.send(unique, 0, struct.pack("<QII", TTL, 0, 0) + a)
        elif op == OPEN:
            flags = struct.unpack_from("<I", arg)[0]
            if self.name_of(node) is None or flags & (os.O_WRONLY | os.O_RDWR):
                self.send(unique, errno.EACCES)
            else:
                self.send(unique, 0, struct.pack("<QII", node, FOPEN_DIRECT_IO, 0))
        elif op == READ:
            _fh, offset, size = struct.unpack_from("<QQI", arg)
            name = self.name_of(node)
            if name is None:
                self.send(unique, errno.EBADF)
                return True
            lo_hi = self.hang.get(name)
            if lo_hi is not None and offset < lo_hi[1] and offset + size > lo_hi[0] and not self.release:
                self.held.append((unique, name, offset, size))
                return True
            data = self.data(name, offset, size)
            body = OUT_HEADER.pack(OUT_HEADER.size + len(data), 0, unique) + data
            wait = float(self.delay.get(name, 0))
            if wait > 0:
                self.seq += 1
                heapq.heappush(self.later, (time.monotonic() + wait, self.seq, body))
            else:
                self.write_raw(body)
        elif op in (RELEASE, FLUSH, RELEASEDIR):
            self.send(unique)
        elif op == STATFS:
            self.send(unique, 0, struct.pack("<QQQQQIIII24x", 0, 0, 0, 0, 0, 4096, 255, 4096, 0))
        else:
            self.send(unique, errno.ENOSYS)
        return True

    def write_raw(self, msg: bytes) -> None:
        try:
            os.write(self.fd, msg)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise

    def answer_held(self) -> None:
        held, self.held = self.held, []
        for unique, name, offset, size in held:
            data = self.data(name, offset, size)
            self.write_raw(OUT_HEADER.pack(OUT_HEADER.size + len(data), 0, unique) + data)

    def serve(self) -> None:
        while True:
            if self.release and self.held:
                self.answer_held()
            now = time.monotonic()
            while self.later and self.later[0][0] <= now:
                self.write_raw(heapq.heappop(self.later)[2])
            wait = 0.1 if not self.later else max(0.0, min(0.1, self.later[0][0] - now))
            ready, _, _ = select.select([self.fd], [], [], wait)
            if not ready:
                continue
            try:
                req = os.read(self.fd, (1 << 20) + 4096)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
                    continue
                if e.errno == errno.ENODEV:  # unmounted
                    return
                raise
            if not self.handle(req):
                return


def main() -> int:
    mnt, backing, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        print(f"error: /dev/fuse cannot be opened ({e})", flush=True)
        return 1
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,default_permissions".encode()
    ms_nosuid, ms_nodev, ms_rdonly = 2, 4, 1
    rc = libc.mount(b"hangfs", mnt.encode(), b"fuse.hangfs", ms_nosuid | ms_nodev | ms_rdonly, opts)
    if rc != 0:
        err = ctypes.get_errno()
        print(f"error: mount of a FUSE file system refused ({os.strerror(err)})", flush=True)
        return 1
    server = Server(fd, backing, spec)

    def release(*_):
        server.release = True

    signal.signal(signal.SIGUSR1, release)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
