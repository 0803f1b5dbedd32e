"""The command line as users meet it: the console script names itself in its usage line,
`bench --help` gives the whole description, `bench` without mpi4py says how to install it, and a
build without MPI reports no MPI thread level."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import _env

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=_env({}), capture_output=True, text=True, timeout=120, **kw)


def test_console_script_and_module_name_themselves_in_usage():
    script = Path(sys.executable).parent / "pyddstore"  # installed by pip/maturin with the package
    assert script.exists(), f"no console script beside {sys.executable}"
    out = _run([str(script), "--help"])
    assert out.returncode == 0 and out.stdout.startswith("usage: pyddstore "), out.stdout + out.stderr
    out = _run([str(script), "bench", "--help"])
    assert out.returncode == 0 and out.stdout.startswith("usage: pyddstore bench "), out.stdout
    out = _run([sys.executable, "-m", "pyddstore", "--help"])
    assert out.stdout.startswith("usage: python -m pyddstore "), out.stdout


def test_bench_help_gives_the_whole_description():
    from pyddstore.benchmarks import stores

    out = _run([sys.executable, "-m", "pyddstore", "bench", "--help"])
    assert out.returncode == 0, out.stderr
    first_paragraph = " ".join(stores.__doc__.split("\n\n")[0].split())
    assert first_paragraph.endswith("for the fabric).")
    assert first_paragraph in " ".join(out.stdout.split()), out.stdout


BLOCK_MPI4PY = "import sys; sys.modules['mpi4py'] = None; sys.argv[0] = 'pyddstore'; "


def test_bench_without_mpi4py_says_how_to_install_it():
    """mpi4py not importable: a message naming pip install mpi4py and the extra, no traceback."""
    code = BLOCK_MPI4PY + "from pyddstore.__main__ import main; main(['bench', '--seconds', '0.01'])"
    out = _run([sys.executable, "-c", code])
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "ModuleNotFoundError" not in out.stderr, out.stderr
    assert "pip install mpi4py" in out.stderr and '".[bench]"' in out.stderr, out.stderr
    # The other benchmarks share the message.
    code = BLOCK_MPI4PY + "from pyddstore.benchmarks.paths import main; main(['--rounds', '1'])"
    out = _run([sys.executable, "-c", code])
    assert out.returncode == 1 and "pip install mpi4py" in out.stderr, out.stderr


def test_bench_extra_installs_mpi4py():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("mpi4py") for dep in extras["bench"]), extras["bench"]


def test_info_without_mpi_prints_no_thread_level(monkeypatch, capsys):
    """A build without the cargo feature mpi has no thread level to report (the real no-MPI build
    is checked the same way by test_packaging.py::test_build_without_mpi, slow tier)."""
    from pyddstore import __main__ as cli
    from pyddstore import _native

    monkeypatch.setattr(_native, "HAS_MPI", False)
    monkeypatch.delitem(os.environ, "DDSTORE_MPI_THREAD_LEVEL", raising=False)
    cli.info()
    out = capsys.readouterr().out
    assert "MPI thread level: no MPI" in out and "MPI thread level (method 0)" not in out, out
    assert cli.collect()["choice"]["mpi_thread_level"]["value"] == "no MPI"
