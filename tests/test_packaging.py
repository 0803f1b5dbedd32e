"""Packaging: `pip wheel` of the repository root, installed into a clean venv, carries no shared
library but the extension (no bundled libmpi/libfabric), stripped; the documented install lines
(`pip install ".[torch,mpi]"` from the root) run as written in clean venvs.

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
        # Developers' harnesses stay in tools/ (they compare builds, run in other environments).
        benches = sorted(
            Path(n).stem for n in names if n.startswith("pyddstore/benchmarks/") and n.endswith(".py")
        )
        shipped = sorted(p.stem for p in (ROOT / "pyddstore/python/pyddstore/benchmarks").glob("*.py"))
        assert benches == shipped and "auth_cost" not in benches, benches
        assert not [n for n in names if n.startswith("tools/") or "/tools/" in n], names
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
    # The wheel just checked, not a second build: test_install_lines_run_the_quickstart_and_the_
    # reference_renders runs `pip install ".[torch,mpi]"` from the root as the docs write it.
    _run([py, "-m", "pip", "install", "-q", str(wheel)], env=env)
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


# --- Every install line of README.md and docs/, as written ----------------------------------

# The recipes' lines that run on this machine, in the order a reader types them: a laptop's
# first install (mpi4py from its binary wheel, through the `mpi` extra), and a cluster's
# (mpi4py built from source against the site's MPI first; Perlmutter's `pip install torch`).
LAPTOP_LINES = ['pip install ".[torch,mpi]"']
CLUSTER_LINES = [
    "pip install --no-cache-dir --no-binary mpi4py mpi4py",
    "pip install torch",
    'pip install ".[torch,mpi]"',
]
# The lines that need another site, each with where it is tested instead.
SITE_LINES = {
    'MATURIN_PEP517_ARGS="--no-default-features" pip install .': "make check-no-mpi (test_build_without_mpi)",
    'MPICC="cc -shared" pip install --no-cache-dir --no-binary mpi4py mpi4py': "a Cray's cc wrapper",
    "pip install torch --index-url https://download.pytorch.org/whl/rocm7.1": "PyTorch's ROCm build",
}
# What the venvs get from the test command's own environment instead of from the index: torch
# and what it needs (2.8 GB of wheels), as a site's Python module provides them. The packages
# the install lines themselves bring (pyddstore, mpi4py, numpy, tqdm) and pip's own are left out.
NOT_LAYERED = ("pyddstore", "mpi4py", "numpy", "tqdm", "pip", "setuptools", "wheel", "maturin")
NOT_LAYERED += ("_distutils_hack", "pkg_resources", "__editable__", "h5py", "zarr", "__pycache__")


def documented_install_lines() -> list[str]:
    """Every `pip install` line of a code block in README.md and docs/, its comment dropped."""
    import re

    lines = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", path.read_text(), re.M | re.S):
            for line in block.splitlines():
                command = line.split("  #")[0].strip()
                if re.search(r"\bpip3? install\b", command) and command not in lines:
                    lines.append(command)
    return lines


def test_every_documented_install_line_is_tested_here_or_placed():
    """A new install line in the docs is either run by test_install_lines_run_the_quickstart or
    named in SITE_LINES with the site it needs."""
    lines = documented_install_lines()
    unplaced = [x for x in lines if x not in LAPTOP_LINES + CLUSTER_LINES and x not in SITE_LINES]
    assert not unplaced, f"install lines neither run here nor placed at a site: {unplaced}"
    assert set(LAPTOP_LINES + CLUSTER_LINES) <= set(lines), "a tested line is no longer documented"
    assert set(SITE_LINES) <= set(lines), "SITE_LINES names a line the docs no longer have"


def test_every_extra_the_docs_name_exists():
    """The extras README.md and docs/ name in prose (`".[graph]"`, `".[hdf5,zarr]"`) are pyproject's."""
    import re

    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for group in re.findall(r"\.\[([\w,]+)\]", path.read_text()):
            named |= set(group.split(","))
    assert {"torch", "mpi"} <= named, named
    assert not named - extras, f"extras the docs name but pyproject lacks: {named - extras}"


def _torch_layer(path: Path) -> Path:
    """A directory of links to the entries of the site-packages holding torch, less NOT_LAYERED."""
    torch = pytest.importorskip("torch")
    site = Path(torch.__file__).resolve().parent.parent
    path.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        if entry.suffix == ".pth" or name.startswith(NOT_LAYERED):
            continue
        (path / entry.name).symlink_to(entry)
    return path


def _venv_with_torch_layer(path: Path, layer: Path) -> Path:
    py = _clean_venv(path)
    purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(purelib, "site-torch.pth").write_text(f"{layer}\n")  # after the venv's own site-packages
    return py


def _type_lines_then_quickstart(venv: Path, lines: list[str], env: dict, before: dict | None = None) -> str:
    """The lines as a reader types them (the venv activated, in the checkout), each after the
    variable assignments `before` gives it (for that line alone), then the quickstart with
    `mpirun -n 2` as docs/index.md shows it; its output."""
    before = before or {}
    script = " && ".join([f". {venv}/bin/activate", *(f"{before.get(x, '')} {x}".strip() for x in lines)])
    _run(["bash", "-c", script], env=env, timeout=1800)
    probe_code = "import pyddstore, mpi4py; print(pyddstore.__file__)"
    probe = _run([venv / "bin" / "python", "-c", probe_code], env=env, cwd=venv)
    assert str(venv) in probe.stdout, f"pyddstore not from the venv: {probe.stdout}"
    run_env = {
        **env,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        "FI_TCP_IFACE": "lo",
        "DDSTORE_QUIET": "1",
    }
    cmd = f". {venv}/bin/activate && mpirun -n 2 python examples/quickstart.py"
    out = _run(["bash", "-c", cmd], env=run_env, timeout=600).stdout
    for rank in (0, 1):
        for epoch in (0, 1):
            assert f"rank {rank} of 2, epoch {epoch}: 5000 samples read" in out, out
    return out


# In a venv with pyddstore installed: the first line of each documented object's docstring and of
# each public member's, from the installed package, as JSON [[name, first line], ...].
DOCUMENTED_TEXT = r"""
import importlib, inspect, json, re, sys
pages = sys.argv[1:]
found = []
for page in pages:
    for target in re.findall(r"^::: (\S+)", open(page).read(), re.M):
        module, name = target.rsplit(".", 1)
        obj = getattr(importlib.import_module(module), name)
        items = [(target, obj)]
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") and attr != "check_worker_number_rationality":
                    items.append((f"{target}.{attr}", getattr(obj, attr) if callable(value) else value))
        for qual, value in items:
            doc = inspect.getdoc(value) if not isinstance(value, (int, str, tuple)) else None
            own = qual == target or doc != inspect.getdoc(type(value))
            if doc and own and not doc.startswith("Alias for field number"):  # a namedtuple's field
                found.append([qual, doc.split(chr(10))[0]])
print(json.dumps(found))
"""


def _words(text: str) -> str:
    """Text as a reader sees it: no Markdown code marks or links, whitespace collapsed."""
    import re

    text = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", text.replace("`", ""))
    return " ".join(text.split())


def _reference_renders_in(venv: Path, tmp_path: Path, env: dict) -> None:
    """`mkdocs build --strict` in the venv (the docs toolchain from the layer), from a copy of the
    docs and the Python sources without a built extension, as after `pip install .`: every class,
    function and method the reference pages name shows its docstring's first line."""
    import html
    import json
    import re
    import shutil

    copy = tmp_path / "docs-checkout"
    for part in ("docs", "examples", "mkdocs.yml", "pyddstore/python"):
        src, dst = ROOT / part, copy / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        else:
            shutil.copy(src, dst)
    py = venv / "bin" / "python"
    docs_env = {**env, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    out = _run([py, "-m", "mkdocs", "build", "--strict", "-d", str(site)], env=docs_env, cwd=copy)
    assert "WARNING" not in out.stdout + out.stderr, out.stderr
    pages = sorted((copy / "docs" / "reference").glob("*.md"))
    want = json.loads(_run([py, "-c", DOCUMENTED_TEXT, *map(str, pages)], env=env, cwd=tmp_path).stdout)
    text = ""
    for page in pages:
        built = (site / "reference" / page.stem / "index.html").read_text()
        text += _words(html.unescape(re.sub(r"<[^>]+>", "", built)))
    missing = [name for name, first in want if _words(first)[:60] not in text]
    assert len(want) > 60 and not missing, f"reference entries without their text: {missing}"


@pytest.mark.slow
def test_install_lines_run_the_quickstart_and_the_reference_renders(tmp_path):
    """The documented install lines, as written, in clean venvs, then the quickstart: the laptop's
    first line alone must bring everything the quickstart imports (mpi4py included). In the
    laptop's venv the API reference then renders every documented object's text."""
    layer = _torch_layer(tmp_path / "torch-layer")
    env = _build_env()
    laptop = tmp_path / "laptop"
    _venv_with_torch_layer(laptop, layer)
    _type_lines_then_quickstart(laptop, LAPTOP_LINES, env)
    _reference_renders_in(laptop, tmp_path, env)
    cluster = tmp_path / "cluster"
    _venv_with_torch_layer(cluster, layer)
    # mpi4py's one large C file unoptimised and without debug info (3 min of CPU at -O2 -g, 25 min
    # at load 15 here), for its line alone: the C parts of the Rust build read CFLAGS too, and a
    # change rebuilds the whole extension in release mode (twice: here, and at the next build).
    _type_lines_then_quickstart(cluster, CLUSTER_LINES, env, before={CLUSTER_LINES[0]: 'CFLAGS="-O0 -g0"'})
    mpi4py_from = _run([cluster / "bin" / "python", "-m", "pip", "show", "-f", "mpi4py"], env=env).stdout
    assert str(cluster) in mpi4py_from, mpi4py_from  # built from source into the venv, not the layer's
