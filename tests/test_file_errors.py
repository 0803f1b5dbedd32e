"""A file pyddstore cannot use raises a DDStoreFileError, an OSError, whichever language met
the failure: the Rust file loader (PyDDStore.load_file_ranges, what DistDataset's file sources
and snapshot restores use) and the Python source readers give the same classes, with the
FileNotFoundError / PermissionError subclasses by the operating system's error
(pyddstore/src/errors.rs is the one mapping)."""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid

import numpy as np
import pytest
from pyddstore._sources import npy_files

import pyddstore
from pyddstore import (
    DDStoreError,
    DDStoreFileError,
    DDStoreFileNotFoundError,
    DDStoreFilePermissionError,
    _native,
)

ROW_BYTES = 16
ROWS = 4


@pytest.fixture(scope="module")
def store():
    s = pyddstore.PyDDStore(None, method=1)
    s.init("x", ROWS, ROW_BYTES)
    yield s
    s.free()


def whole(nbytes: int) -> np.ndarray:
    """One read of `nbytes` from the start of file 0 into the start of the share."""
    return np.array([[0, 0, nbytes, -1, 0, nbytes, 0]], dtype=np.int64)


def rows_file(directory: str, name: str, nbytes: int) -> tuple[str, bytes]:
    data = np.arange(nbytes, dtype=np.uint8).tobytes()
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path, data


def test_a_file_that_vanished_is_a_file_not_found_error(store, tmp_path):
    path, data = rows_file(str(tmp_path), "gone.bin", ROWS * ROW_BYTES)
    moved, _ = store.load_file_ranges("x", [path], whole(len(data)))
    out = np.zeros((ROWS, ROW_BYTES), np.uint8)
    store.get("x", out)
    assert moved == len(data) and out.tobytes() == data
    os.unlink(path)  # deleted between two loads (a dataset cleaned up under a running job)
    with pytest.raises(FileNotFoundError) as got:
        store.load_file_ranges("x", [path], whole(len(data)))
    e = got.value
    assert isinstance(e, DDStoreFileNotFoundError) and isinstance(e, DDStoreFileError)
    assert isinstance(e, OSError) and isinstance(e, DDStoreError)
    assert e.errno == errno.ENOENT and "gone.bin cannot be opened" in str(e), (e.errno, str(e))


def test_a_truncated_file_is_a_file_error_from_rust_and_python(store, tmp_path):
    path, _ = rows_file(str(tmp_path), "short.bin", ROW_BYTES)  # one row where four are read
    with pytest.raises(OSError) as got:
        store.load_file_ranges("x", [path], whole(ROWS * ROW_BYTES))
    assert type(got.value) is DDStoreFileError, type(got.value)
    assert "short.bin is truncated" in str(got.value), str(got.value)
    # The same file as a .npy source whose header promises more rows: Python's check, same class.
    npy = os.path.join(str(tmp_path), "short.npy")
    np.save(npy, np.zeros((100, 4), np.float32))
    with open(npy, "r+b") as f:
        f.truncate(os.path.getsize(npy) - 64)
    with pytest.raises(OSError) as got:
        npy_files([npy])
    assert type(got.value) is DDStoreFileError and "truncated" in str(got.value), got.value


def test_a_missing_npy_source_is_the_same_class_as_a_missing_loaded_file(tmp_path):
    with pytest.raises(DDStoreFileNotFoundError) as got:
        npy_files([os.path.join(str(tmp_path), "missing.npy")])
    assert got.value.errno == errno.ENOENT and "missing.npy" in str(got.value)
    # Python's errors go through the Rust mapping: errno picks the class.
    assert type(_native.file_error("m", errno.EACCES)) is DDStoreFilePermissionError
    assert type(_native.file_error("m", errno.EIO)) is DDStoreFileError
    assert type(_native.file_error("m")) is DDStoreFileError


# Imports and makes its store as root (the interpreter and the package may live where only root
# reads), then becomes the second user for good (setgid, setuid) before the load opens the file.
SECOND_USER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import pyddstore
    path, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    s = pyddstore.PyDDStore(None, method=1)
    s.init("x", 4, 16)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    assert os.getuid() == os.geteuid() == uid
    try:
        s.load_file_ranges("x", [path], np.array([[0, 0, 64, -1, 0, 64, 0]], dtype=np.int64))
        print("READ")
    except PermissionError as e:
        print("PermissionError", type(e).__name__, isinstance(e, pyddstore.DDStoreFileError), e.errno, e)
    finally:
        s.free()
    """
)


@pytest.fixture()
def other_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user")
    if not (shutil.which("useradd") and shutil.which("userdel")):
        pytest.skip("useradd/userdel not available")
    name = f"ddsfile{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def test_a_file_another_user_cannot_read_is_a_permission_error(other_user):
    d = tempfile.mkdtemp(prefix="ddsfile-")
    try:
        os.chmod(d, 0o755)
        path, _ = rows_file(d, "private.bin", ROWS * ROW_BYTES)
        os.chmod(path, 0o600)  # root's file: the second user may not read it
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDSTORE_")}
        argv = [sys.executable, "-c", SECOND_USER, path, str(other_user.pw_uid), str(other_user.pw_gid)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=d)
        assert out.returncode == 0, out.stderr[-3000:]
        words = out.stdout.split()
        assert words[:5] == [
            "PermissionError",
            "DDStoreFilePermissionError",
            "True",
            str(errno.EACCES),
            path,
        ], out.stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- snapshots --------------------------------------------------------------------------------

# Becomes the second user, then meets root's snapshot: a manifest it may not read, a directory
# it may not create. Each line: the error's classes and errno.
SNAPSHOT_AS_SECOND_USER = textwrap.dedent(
    """
    import os, sys
    from pyddstore.torch._snapshot import prepare_directory, read_manifest
    snap, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    for call, arg in ((read_manifest, snap), (prepare_directory, os.path.join(snap, "new"))):
        try:
            call(arg)
            print("NO-ERROR")
        except PermissionError as e:
            print(type(e).__name__, type(e).__mro__[1].__name__, e.errno)
    """
)


def test_snapshot_errors_keep_errno_and_the_os_error_subclass(tmp_path, other_user):
    from pyddstore.torch import SnapshotError
    from pyddstore.torch._agree import error_payload, rebuild_error
    from pyddstore.torch._snapshot import MANIFEST, read_manifest

    # A missing manifest: a SnapshotError that is a FileNotFoundError, errno ENOENT; and
    # another rank (or a load worker) rebuilds it as the same.
    with pytest.raises(FileNotFoundError) as missing:
        read_manifest(str(tmp_path))
    assert isinstance(missing.value, SnapshotError) and isinstance(missing.value, DDStoreFileNotFoundError)
    assert missing.value.errno == errno.ENOENT and MANIFEST in str(missing.value)
    again = rebuild_error(error_payload(missing.value, 3))
    assert isinstance(again, SnapshotError) and isinstance(again, FileNotFoundError)
    assert again.errno == errno.ENOENT and str(again).startswith("rank 3: ")
    # A plain file error keeps its errno across ranks too.
    denied = rebuild_error(error_payload(_native.file_error("f", errno.EACCES), 1))
    assert type(denied) is DDStoreFilePermissionError and denied.errno == errno.EACCES

    # Another user: root's manifest (0600) and root's snapshot directory (0755) refuse it.
    d = tempfile.mkdtemp(prefix="ddssnap-")
    try:
        os.chmod(d, 0o755)
        open(os.path.join(d, MANIFEST), "w").close()
        os.chmod(os.path.join(d, MANIFEST), 0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDSTORE_")}
        argv = [
            sys.executable,
            "-c",
            SNAPSHOT_AS_SECOND_USER,
            d,
            str(other_user.pw_uid),
            str(other_user.pw_gid),
        ]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=d)
        assert out.returncode == 0, out.stderr[-3000:]
        want = f"SnapshotPermissionError SnapshotError {errno.EACCES}"
        assert out.stdout.splitlines() == [want, want], out.stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)
