"""Packaging: `pip install .` from the repository root into a clean venv, and the wheel
carries no shared library but the extension (no bundled libmpi/libfabric), stripped.

Both builds reuse the checkout's cargo target directory, so after the test command's own
build they only relink. DDSTORE_TEST_NO_MPI=1 also builds without the `mpi` feature
(`make check-no-mpi`) and checks methods 1/2 work and method 0 raises."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A tiny round trip in the clean venv: a one-process store (method 1), content checked.
ROUND_TRIP = r"""
import numpy as np, pyddstore
from pyddstore import _native
s = pyddstore.PyDDStore(None, method=1)
x = np.arange(40, dtype=np.float32).reshape(10, 4)
s.add("x", x)
out = np.empty((3, 4), np.float32)
s.get_batch("x", out, np.array([9, 0, 4]))
assert (out == x[[9, 0, 4]]).all(), out
s.free()
print("methods", _native.METHODS, "mpi", _native.HAS_MPI)
"""

NO_MPI_CHECK = r"""
import pyddstore
from pyddstore import _native
assert not _native.HAS_MPI and _native.METHODS == [1, 2], (_native.HAS_MPI, _native.METHODS)
try:
    pyddstore.PyDDStore(None, method=0)
except pyddstore.DDStoreUnsupportedError as e:
    assert "built without MPI" in str(e) and "method=1" in str(e), e
else:
    raise AssertionError("method=0 without MPI must raise")
print("no-mpi ok")
"""


def _run(cmd, env=None, timeout=900, cwd=ROOT):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _clean_venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(path)])
    return path / "bin" / "python"


def _build_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env["CARGO_TARGET_DIR"] = str(ROOT / "target")  # incremental: reuse the test command's build
    env.update(extra or {})
    return env


def _elf_sections(elf: bytes) -> list[str]:
    """Section names of a little-endian ELF64 file."""
    import struct

    assert elf[:4] == b"\x7fELF" and elf[4] == 2, "not an ELF64 file"
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]
    return [elf[strtab_off + h[0] : elf.index(b"\0", strtab_off + h[0])].decode() for h in headers]


def _check_wheel(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        libs = [n for n in names if ".so" in Path(n).name]
        assert libs == ["pyddstore/_native.abi3.so"], f"the wheel must carry only the extension: {libs}"
        assert not [n for n in names if ".libs/" in n], f"bundled libraries in {names}"
        ext = z.read("pyddstore/_native.abi3.so")
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        assert any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names), names
    # Stripped: no DWARF sections (the unstripped release build is ~10x larger).
    debug = [n for n in _elf_sections(ext) if n.startswith(".debug")]
    assert not debug, f"the extension ships debug info: {debug}"
    assert len(ext) < 8 << 20, f"extension is {len(ext) >> 20} MiB: not stripped?"
    assert "linux_" in wheel.name and "manylinux" not in wheel.name, wheel.name
    for field in ("Requires-Python: >=3.9", "Provides-Extra: torch", "Provides-Extra: mpi", "Classifier: "):
        assert field in meta, f"{field!r} missing from the wheel's METADATA"
    assert (
        "Provides-Extra: graph" in meta and "Provides-Extra: bench" in meta and "Provides-Extra: dev" in meta
    )


@pytest.mark.slow
def test_pip_install_root_and_wheel_has_no_bundled_libraries(tmp_path):
    py = _clean_venv(tmp_path / "venv")
    # MPI located by MPI_HOME alone (the build backend maps it to MPICC for the mpi crate).
    env = _build_env({"MPI_HOME": "/usr", "MPICC": ""}) if os.path.exists("/usr/bin/mpicc") else _build_env()
    wheels = tmp_path / "wheels"
    _run([py, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)], env=env)
    (wheel,) = wheels.glob("pyddstore-*.whl")
    _check_wheel(wheel)
    _run([py, "-m", "pip", "install", "-q", str(ROOT)], env=env)
    out = _run([py, "-c", ROUND_TRIP], env={**env, "FI_TCP_IFACE": "lo", "DDSTORE_QUIET": "1"}, cwd=tmp_path)
    assert "methods [0, 1, 2] mpi True" in out.stdout, out.stdout
    out = _run([py, "-m", "pyddstore", "info"], env=env, cwd=tmp_path)
    assert "pyddstore" in out.stdout and "method" in out.stdout


def test_build_backend_maps_mpi_home_to_mpicc(tmp_path):
    sys.path.insert(0, str(ROOT / "build_backend"))
    try:
        from pyddstore_build import _site_environment
    finally:
        sys.path.pop(0)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mpicc").write_text("#!/bin/sh\n")
    environ = {"MPI_HOME": str(tmp_path)}
    _site_environment(environ)
    assert environ["MPICC"] == str(tmp_path / "bin" / "mpicc")
    given = {"MPI_HOME": str(tmp_path), "MPICC": "cc"}  # an explicit MPICC wins
    _site_environment(given)
    assert given["MPICC"] == "cc"
    empty = {"MPI_HOME": str(tmp_path / "nowhere")}  # no wrapper there: nothing set
    _site_environment(empty)
    assert "MPICC" not in empty


def test_build_backend_hooks_print_no_false_maturin_warning(tmp_path):
    """pip goes through build_backend/pyddstore_build.py, which is maturin's backend: maturin's
    "build-backend is not set to maturin" warning (once per hook) would be false, so it is off."""
    pytest.importorskip("maturin")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import pyddstore_build as b; "
        "print(b.prepare_metadata_for_build_wheel(sys.argv[2]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "MATURIN_NO_MISSING_BUILD_BACKEND_WARNING"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "build_backend"), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "dist-info" in proc.stdout, proc.stderr
    assert "not set to `maturin`" not in proc.stderr, proc.stderr


@pytest.mark.skipif(os.environ.get("DDSTORE_TEST_NO_MPI") != "1", reason="opt-in: make check-no-mpi")
def test_build_without_mpi(tmp_path):
    py = _clean_venv(tmp_path / "venv")
    env = _build_env({"MATURIN_PEP517_ARGS": "--no-default-features"})
    _run([py, "-m", "pip", "install", "-q", str(ROOT)], env=env)
    run_env = {**env, "FI_TCP_IFACE": "lo", "DDSTORE_QUIET": "1"}
    out = _run([py, "-c", ROUND_TRIP], env=run_env, cwd=tmp_path)
    assert "methods [1, 2] mpi False" in out.stdout, out.stdout
    _run([py, "-c", NO_MPI_CHECK], env=run_env, cwd=tmp_path)
    out = _run([py, "-m", "pyddstore", "info"], env=run_env, cwd=tmp_path)
    assert "not in this build" in out.stdout, out.stdout
    no_level = "thread level (method 0)" not in out.stdout
    assert "MPI thread level: no MPI" in out.stdout and no_level, out.stdout
