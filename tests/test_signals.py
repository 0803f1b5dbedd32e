"""Python's signals and exit codes with pyddstore loaded, and a job that loses a rank
(issue 36 items 4 and 5).

Debian's libfabric links the PSM libraries (libinfinipath, libpsm2); libinfinipath's load-time
handlers made Ctrl-C, SIGTERM and abort() exit with status 1 and write `*.btr` files into the
working directory. pyddstore sets the variables that stop them before it loads libfabric, and
puts Python's handlers back where a PSM library loaded earlier installed its own (`preloaded`:
the bug as it was, shown by the handlers caught before the import). Real processes, real tcp.

A method-0 rank dying of an uncaught exception used to hang the job (its exit waited in
MPI_Win_free, serving its window to readers, forever); now it aborts the job, and a method-0
store left open at exit is freed there, bounded by DDSTORE_TIMEOUT_S."""

import ctypes.util
import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import SCRIPTS, _env, reports, run_mpi

from pyddstore import _native, _signals

PSM_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGABRT, signal.SIGSEGV}


def test_the_psm_variables_are_one_list_set_before_libfabric_loads_and_reported():
    assert list(_signals.VARIABLES) == _native.PROVIDER_SIGNAL_VARIABLES
    probe = "import json, pyddstore; print(json.dumps(pyddstore._native.libfabric_env()))"
    env = child_env()
    fresh = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=True
        ).stdout
    )
    for name in _signals.VARIABLES:
        assert fresh["variables"][name] == ["1", True], fresh
        assert "signal handlers" in fresh["why"][name], fresh
    env["IPATH_NO_BACKTRACE"] = "mine"
    user = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=True
        ).stdout
    )
    assert user["variables"]["IPATH_NO_BACKTRACE"] == ["mine", False], user
    assert user["variables"]["HFI_NO_BACKTRACE"] == ["1", True], user


def child_env() -> dict:
    env = _env({"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"})
    for name in _signals.VARIABLES:
        env.pop(name, None)
    return env


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(tmp_path, mode: str, *flags: str):
    """The child, started in `tmp_path`, once it reported ready: (process, its report)."""
    if "preloaded" in flags and ctypes.util.find_library("infinipath") is None:
        pytest.skip("no libinfinipath here to load before pyddstore")
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "signal_child.py"), mode, *flags],
        cwd=tmp_path,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal's command starts: a test run started in the background by a shell
        # without job control inherits SIGINT ignored, and Python then installs no handler.
        preexec_fn=_sigint_default,
    )
    line = proc.stdout.readline()
    if not line.startswith("ready "):
        proc.kill()
        raise AssertionError(f"child not ready: {line!r}\n{proc.communicate(timeout=60)[1][-3000:]}")
    report = json.loads(line[len("ready ") :])
    assert report["transport"] == "ofi:tcp;ofi_rxm", report
    return proc, report


def check_handlers(report: dict, flags: tuple) -> None:
    # With the store open (after fi_getinfo), no PSM handler is left and Python's SIGINT is back.
    assert report["psm_handlers"] == [], report
    assert signal.SIGINT in report["caught"] and signal.SIGTERM not in report["caught"], report
    if "preloaded" in flags:
        # The bug this guards against is real here: libinfinipath's own handlers were in place.
        assert PSM_SIGNALS <= set(report["caught_before_import"]), report
    if "faulthandler" not in flags:
        assert signal.SIGABRT not in report["caught"] and signal.SIGSEGV not in report["caught"], report


@pytest.mark.parametrize("flags", [(), ("preloaded",)], ids=["plain", "preloaded"])
@pytest.mark.parametrize(
    "sig, code", [(signal.SIGINT, 0), (signal.SIGTERM, -signal.SIGTERM)], ids=["sigint", "sigterm"]
)
def test_ctrl_c_raises_keyboard_interrupt_and_sigterm_exits_143(tmp_path, flags, sig, code):
    proc, report = start(tmp_path, "wait", *flags)
    check_handlers(report, flags)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, (proc.returncode, out, err[-3000:])
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in out, out
    assert list(tmp_path.glob("*.btr")) == [], err[-3000:]
    assert "terminated with signal" not in err, err[-3000:]


@pytest.mark.parametrize(
    "flags", [(), ("preloaded",), ("preloaded", "faulthandler")], ids=["plain", "preloaded", "faulthandler"]
)
def test_abort_exits_134_and_writes_no_btr_file(tmp_path, flags):
    proc, report = start(tmp_path, "abort", *flags)
    check_handlers(report, flags)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, out, err[-3000:])
    assert list(tmp_path.glob("*.btr")) == [], err[-3000:]
    assert "terminated with signal" not in err, err[-3000:]
    if "faulthandler" in flags:  # faulthandler's handler is back: it reports the abort
        assert "Fatal Python error: Aborted" in err, err[-3000:]


def test_this_build_links_the_psm_libraries(tmp_path):
    """Where libfabric links a PSM library (Debian's does), the tests above ran against it."""
    proc, report = start(tmp_path, "abort")
    proc.communicate(timeout=120)
    if not report["psm_mapped"]:
        pytest.skip("this libfabric loads no PSM library: the tests above ran without one")
    assert report["psm_mapped"]


# -- a rank that dies --------------------------------------------------------------------------

LIMIT = 5  # DDSTORE_TIMEOUT_S


def job_ends_in_time(method: int, how: str) -> str:
    env = {"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp", "DDSTORE_TIMEOUT_S": str(LIMIT)}
    proc = run_mpi(3, "rank_dies.py", str(method), how, env=env, timeout=240, expect_ok=False)
    ended = time.time()
    waiting = reports(proc.stdout, "waiting")
    assert proc.returncode != 0 and waiting, proc.stdout[-3000:] + proc.stderr[-3000:]
    waited = ended - min(r["since"] for r in waiting)
    print(f"method {method}, rank 1 {how}: the job ended {waited:.1f} s after the others went on")
    # A method-0 rank stuck in MPI_Win_free serves reads: rank 0's reads then run 60 s.
    assert waited < LIMIT + 10, (waited, proc.stderr[-3000:])
    assert "read on for 60 s" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


def test_a_method_0_rank_dying_of_an_uncaught_exception_aborts_the_job():
    err = job_ends_in_time(0, "raise")
    assert "RuntimeError: rank 1 fails (on purpose)" in err, err[-3000:]
    assert "aborting the MPI job (a method-0 store is open" in err, err[-3000:]


def test_a_method_0_rank_exiting_with_its_store_open_ends_the_job():
    # sys.exit runs no exception hook: the exit frees the store, bounded, instead of hanging.
    err = job_ends_in_time(0, "exit")
    assert "DDStoreTimeoutError" in err or "left unfreed" in err, err[-3000:]


@pytest.mark.slow
def test_a_method_1_rank_dying_ends_the_job_by_timeouts():
    err = job_ends_in_time(1, "raise")
    assert "aborting the MPI job" not in err and "DDStoreTimeoutError" in err, err[-3000:]
