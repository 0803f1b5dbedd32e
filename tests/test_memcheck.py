"""Issue 8, sanitizers: the Rust suites that exercise unsafe code (regions, shared
mappings, the store, the planner, fabric records) run clean under valgrind memcheck
(AddressSanitizer needs nightly Rust). The long variant with the libfabric transport
scenarios is ``bash scripts/check-memory.sh --ofi`` (``make check-memory``)."""

import shutil
import subprocess
from pathlib import Path

import pytest

# Long runs: the slow tier (`pytest -m slow`), after the default one.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_rust_suites_are_clean_under_valgrind_memcheck():
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (the README's test command installs it)")
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not on PATH")
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check-memory.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(out.stdout[-3000:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "check-memory: ok" in out.stdout
    assert out.stdout.count(": clean (") >= 4, out.stdout
