"""Shared fixtures: launch real multi-process jobs (mpirun, or N plain
processes joined through the file communicator) and fail on any rank's failure."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"

MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    # Ranks waiting in MPI yield the core: Open MPI spins at full speed otherwise whenever a job has
    # no more ranks than cores (a 2-rank job here), taking the CPU the pool's other jobs need
    # (a 2-rank method-0 test: 17-19 CPU s spinning, 9 yielding).
    "OMPI_MCA_mpi_yield_when_idle": "1",
    # Loopback only: tests never leave the machine.
    "FI_TCP_IFACE": "lo",
    "FI_SOCKETS_IFACE": "lo",
    "DDSTORE_QUIET": "1",
    "PYTHONUNBUFFERED": "1",
}


def _env(extra: dict | None) -> dict:
    env = dict(os.environ)
    if "pyddstore._native" in sys.modules:  # each job sets its own libfabric defaults, as a fresh one
        for name, (_, set_here) in sys.modules["pyddstore._native"].libfabric_env()["variables"].items():
            if set_here:
                env.pop(name, None)
    env.update(MPI_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), env.get("PYTHONPATH", "")])
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def _check(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise AssertionError(
            f"{what} exited with {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc


def run_mpi(
    n: int, script: str, *args: str, env: dict | None = None, timeout: float = 240, expect_ok: bool = True
) -> subprocess.CompletedProcess:
    """Runs tests/scripts/<script> under `mpirun -n N` and returns the finished process.

    mpirun's exit status covers every rank (a failing rank fails the run). Open MPI can drop
    the last line a rank prints just before it exits, so tests look for a rank's report,
    not for every rank's."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found: install openmpi-bin (the README's test command does)")
    cmd = ["mpirun", "-n", str(n), "--bind-to", "none", sys.executable, str(SCRIPTS / script), *args]
    with subprocess.Popen(cmd, env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{' '.join(cmd)} timed out after {timeout} s\n{_end_hung(p)}") from None
    proc = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    return _check(proc, " ".join(cmd)) if expect_ok else proc


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _end_hung(p: subprocess.Popen) -> str:
    """Ends a job that outlived its timeout and says where it was: which of its processes were
    stopped (state T), and every rank's Python stacks (SIGUSR1: tests/scripts/_common.py makes
    ranks print them), then kills it all and returns what it printed."""
    procs = _descendants(p.pid)
    states = {pid: _state(pid) for pid in procs}
    try:
        with open(f"/proc/{p.pid}/comm") as f:
            launcher = f.read().strip() in ("mpirun", "mpiexec", "orterun", "prterun")
    except OSError:
        launcher = False
    for pid in procs if launcher else [p.pid, *procs]:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(2)
    for pid in [p.pid, *procs]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out, err = p.communicate()
    return f"process states when it timed out: {states}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"


def start_procs(n: int, script: str, *args: str, env: dict | None = None) -> list[subprocess.Popen]:
    """Starts N plain processes (no MPI) with SLURM_PROCID/SLURM_NTASKS set, as srun would."""
    procs = []
    for rank in range(n):
        e = _env(env)
        e.update({"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(rank)})
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPTS / script), *args],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def run_procs(
    n: int, script: str, *args: str, env: dict | None = None, timeout: float = 240, expect_ok: bool = True
) -> list[subprocess.CompletedProcess]:
    """Runs N plain processes (see start_procs) to the end; checks each exit unless expect_ok=False."""
    procs = start_procs(n, script, *args, env=env)
    done = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = "\n".join(f"rank {r}: {_end_hung(q)}" for r, q in enumerate(procs) if q.poll() is None)
            raise AssertionError(f"rank {rank} of {script} timed out after {timeout}s\n{hung}") from None
        cp = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        done.append(_check(cp, f"rank {rank} of {script}") if expect_ok else cp)
    return done


# Modules that look at or change host-wide state (other users, /dev/shm listings, network namespaces)
# are marked `serial`: scripts/run-tests.sh runs them alone, after the rest ran on its pytest workers.
SERIAL_MODULES = {"test_access.py", "test_attacks.py", "test_node_shm.py", "test_vcluster.py"}

# Seconds the longest tests took in a quiet 2-core CI run (rounded; a test not listed counts 10 s
# if `slow`, else 1 s). Tests run longest first: scripts/run-tests.sh runs both tiers in one pool of
# pytest workers that take one test at a time (--dist load --maxschedchunk 1), so the long tests
# start at once and the short ones fill the gaps, and no worker is left with a long test at the end.
# Only the order depends on this table: a stale entry costs time, never a result.
LONGEST = {
    "test_packaging.py::test_install_lines_run_the_quickstart_and_the_reference_renders": 140,
    "test_make_targets.py::test_target_runs_as_written[demo]": 107,
    "test_make_targets.py::test_target_runs_as_written[soak]": 60,
    "test_requeue.py::test_local_requeue_job": 50,
    "test_memcheck.py::test_rust_suites_are_clean_under_valgrind_memcheck": 43,
    "test_docs.py::test_pages_render_with_nothing_cut": 38,
    "test_bench_torch.py::test_bench_torch_smoke": 32,
    "test_resume_jobs.py::test_kill_resume_and_resize": 26,
    "test_scale_limits.py::test_method_2_extra_ranks_below_one_connection_per_core_rank_read_exactly": 26,
    "test_scale_limits.py::test_16_ranks_below_one_connection_per_peer_read_a_global_shuffle_exactly": 25,
    "test_spill.py::test_dist_dataset_with_a_budget_loads_reads_forks_saves_and_restores": 21,
    "test_make_targets.py::test_target_runs_as_written[bench-load]": 19,
    "test_start_methods.py::test_workers_of_a_script_importing_mpi4py_at_the_top": 19,
    "test_proc_loader.py::test_process_workers_core_group_and_reader": 18,
    "test_packaging.py::test_pip_install_root_and_wheel_has_no_bundled_libraries": 16,
    "test_start_methods.py::test_spawn_and_forkserver_workers_read_every_sample": 16,
    "test_torch_dataset.py::test_mpi_method1[default]": 16,
    "test_method2.py::test_dist_dataset_reader_loaders[tcp]": 16,
    "test_scale_counts.py::test_a_torch_rank_absent_from_a_gloo_barrier_is_named_after_the_timeout": 15,
    "test_torch_graphs.py::test_method2_reader_job": 15,
    "test_load.py::test_snapshot_other_rank_counts_and_damage": 15,
    "test_spill.py::test_a_128_mib_budget_holds_with_same_node_reads_of_the_peers_rows": 23,
    "test_bench_scale.py::test_idle_threads_are_timed_at_each_descriptor_count": 12,
}


def expected_seconds(item) -> float:
    """How long `item` is expected to take, for the order only (see LONGEST)."""
    name = item.nodeid.rsplit("/", 1)[-1]
    return LONGEST.get(name, 10.0 if item.get_closest_marker("slow") else 1.0)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
    # Longest first; otherwise collection order (sorted() is stable: module fixtures stay together).
    items[:] = sorted(items, key=lambda item: -expected_seconds(item))


# Each test's CPU seconds (this process and the jobs it waited for: mpirun, its ranks, builds), carried
# in the teardown report's user_properties so that the pytest pool's controller sees the workers'
# figures. CPU, not wall time, is what the CI's two cores pay: it predicts a tier's time even when
# the machine measuring it is loaded, and does not grow with the pool's contention.
def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_cpu_at_start = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_cpu_at_start] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown" and _cpu_at_start in item.stash:
        item.user_properties.append(("cpu_s", _cpu_seconds() - item.stash[_cpu_at_start]))
    yield


_cpu_by_test: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        _cpu_by_test.update((report.nodeid, v) for k, v in report.user_properties if k == "cpu_s")


# DDSTORE_TEST_SLOWEST=N (scripts/run-tests.sh: 25): the N slowest tests of each tier, the default
# and the slow one, which the test command runs in one pool, with each one's CPU seconds.
# DDSTORE_TEST_CPU_REPORT=1 sorts them by CPU instead (what to shorten first).
_SLOWEST = int(os.environ.get("DDSTORE_TEST_SLOWEST", "0") or 0)
_BY_CPU = os.environ.get("DDSTORE_TEST_CPU_REPORT") == "1"


def pytest_terminal_summary(terminalreporter):
    top = _SLOWEST or (25 if _BY_CPU else 0)
    if not top:
        return
    stats = terminalreporter.stats
    calls = [r for key in ("passed", "failed") for r in stats.get(key, []) if r.when == "call"]
    for tier, in_tier in (("default", False), ("slow", True)):
        tests = [r for r in calls if ("slow" in r.keywords) == in_tier]
        if not tests:
            continue
        cpu = {r.nodeid: _cpu_by_test.get(r.nodeid, 0.0) for r in tests}
        tests.sort(key=(lambda r: -cpu[r.nodeid]) if _BY_CPU else (lambda r: -r.duration))
        total, total_cpu = sum(r.duration for r in tests), sum(cpu.values())
        order = "costliest" if _BY_CPU else "slowest"
        head = f"{tier} tier: {len(tests)} tests, {total:.0f} s, {total_cpu:.0f} CPU s in all, {order} {top}"
        terminalreporter.write_sep("=", head)
        for r in tests[:top]:
            terminalreporter.write_line(f"{r.duration:8.2f}s {cpu[r.nodeid]:7.1f} CPU s  {r.nodeid}")


@pytest.fixture
def handshake_dir(tmp_path):
    d = tmp_path / "hs"
    d.mkdir(mode=0o700)
    return d


def reports(out: str, tag: str) -> list:
    """Every `tag {json}` report in the output. Under mpirun the ranks' lines may run together,
    and with unbuffered Python even the pieces of one print() may interleave: `tag tag {a} {b}`."""
    decoder, found, pos = json.JSONDecoder(), [], 0
    while (pos := out.find(tag, pos)) >= 0:
        pos += len(tag)
        pending = 1
        while out.startswith(tag, pos):
            pos, pending = pos + len(tag), pending + 1
        while pending:
            start = out.find("{", pos)
            if start < 0 or out[pos:start].strip():
                break
            obj, pos = decoder.raw_decode(out, start)
            found.append(obj)
            pending -= 1
    return found


def show(tag, found):
    for r in found:
        print(tag, json.dumps(r))


# Soak configurations: method, settings (scripts/soak.sh runs the long versions).
SOAK_CONFIGS = {
    "method0-mpi-get": ("0", {"DDSTORE_SHM": "0"}),
    "method0-shm": ("0", {"DDSTORE_SHM": "1"}),
    "method1-tcp": ("1", {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}),
    "method1-shm-path": ("1", {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "1"}),
}


def core_group_and_reader(script: str, handshake_dir: Path, env: dict, core_env: dict | None = None) -> None:
    """Method 2 through pyddstore.torch: a core group of two plain processes (file
    communicator) runs `script --part core`, a separate job `script --part reader`;
    the reader touches nothing, the test makes {hs}/reader-done so the core finishes."""
    hs = str(handshake_dir)
    core = start_procs(
        2, script, "--part", "core", "--comm", "file", "--hs", hs, env={**env, **(core_env or {})}
    )
    try:
        args = ("--part", "reader", "--comm", "file", "--hs", hs)
        reader = run_procs(1, script, *args, env=env, timeout=400, expect_ok=False)[0]
    finally:
        (handshake_dir / "reader-done").touch()  # lets the core group finish either way
        outs = [p.communicate(timeout=300) for p in core]
    assert reader.returncode == 0, f"reader failed\n{reader.stdout}\n{reader.stderr}"
    for p, (out, err) in zip(core, outs):
        assert p.returncode == 0, f"core group failed\n{out}\n{err}"
