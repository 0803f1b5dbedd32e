"""Several nodes on one machine (scripts/vcluster.py): each virtual node is a network namespace
with its own hostname (so pyddstore's host id differs) and address on a private bridge; Open MPI
launches across them through an rsh agent. Every read is checked against the owning rank's data;
the jobs count rows by where their owner lives (own, same node, another node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import _env, reports
from vc_fixture import finish, harness, vc_mpirun, vc_start, vcluster_fixture  # noqa: F401 - fixture


def _one_per_rank(out: str, size: int) -> list[dict]:
    found = {r["rank"]: r for r in reports(out, "vcjob")}
    assert found, out
    return [found[r] for r in sorted(found)]


def test_harness_nodes_have_own_hostname_and_address(vcluster):
    for i, ns in enumerate(vcluster.nodes):
        out = subprocess.run(
            vcluster.on_node(i, ["sh", "-c", "hostname; ip -4 -o addr show dev eth0"]),
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        assert out.splitlines()[0] == ns, out
        assert f"{vcluster.addrs[i]}/24" in out, out
        assert (
            f"{vcluster.addr(i, 1)}/24"
            in subprocess.run(
                vcluster.on_node(i, ["ip", "-4", "-o", "addr", "show", "dev", "eth1"]),
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
        )
    # A stale cluster (its creator gone) is swept by the next run's clean_stale().
    assert all(n.startswith(harness.PREFIX) for n in vcluster.nodes)


def test_method1_tcp_mixed_batches_loaders_and_width(vcluster):
    """2 nodes x 2 ranks, method 1 over tcp on eth1 (FABRIC_IFACE): get_batch mixing own,
    same-node (memfd) and remote rows from two threads; DistDataset through ThreadDataLoader
    and forked DataLoader workers; ddstore_width=2 groups that span both nodes."""
    env = {"DDSTORE_FABRIC": "tcp", "FABRIC_IFACE": "eth1", "DDSTORE_FORK_WORKERS": "1", "VC_CHECK_NIC": "1"}
    out = vc_mpirun(
        vcluster, 2, "vc_job.py", "store", "--method", "1", "--torch", env=env, timeout=300
    ).stdout
    ranks = _one_per_rank(out, 4)
    for r in ranks:
        assert r["nodes"] == 2 and r["mismatches"] == 0, r
        assert r["same_node"] > 0 and r["remote"] > 0, r
        assert "tcp" in r["transport"] and r["nic"] == "eth1", r
        assert r["addr"] == vcluster.addr(vcluster.nodes.index(r["host"]), 1), r
        t = r["torch"]
        assert t["thread_loader"] > 0 and t["forked_workers"] > 0 and t["width2"] == 203, t
        assert len(t["width2_group_hosts"]) == 2, f"a ddstore_width group must span two nodes: {t}"


def test_file_comm_across_nodes_with_nic_map(vcluster, handshake_dir):
    """The file communicator (no MPI) across 2 nodes x 2 plain processes; on each node local
    rank 0 uses eth0 and local rank 1 eth1 (DDSTORE_NIC_MAP), checked in the published records."""
    env = {
        "DDSTORE_FABRIC": "tcp",
        "DDSTORE_NIC_MAP": "0:eth0,1:eth1",
        "DDSTORE_MPI": "0",
        "VC_CHECK_NIC": "1",
    }
    args = ("store", "--method", "1", "--comm", "file", "--hs", str(handshake_dir))
    procs = [vc_start(vcluster, r // 2, r, 4, r % 2, "vc_job.py", *args, env=env) for r in range(4)]
    outs = finish(procs, timeout=240)
    for rank, (rc, out, _) in enumerate(outs):
        (r,) = reports(out, "vcjob")
        assert r["nodes"] == 2 and r["mismatches"] == 0, r
        assert r["same_node"] > 0 and r["remote"] > 0, r
        assert r["nic"] == f"eth{rank % 2}" and r["addr"] == vcluster.addr(rank // 2, rank % 2), r


def test_method2_core_on_two_nodes_extra_job_on_a_third(vcluster, handshake_dir):
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_MPI": "0"}
    core = [
        vc_start(vcluster, r, r, 2, 0, "m2_core.py", "--hs", str(handshake_dir), "--comm", "file", env=env)
        for r in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while not all((handshake_dir / f"{v}.ddstore.json").exists() for v in "abc"):
            assert all(p.poll() is None for p in core), finish(core, expect_ok=False)
            assert time.monotonic() < deadline, "the core job did not publish within 120 s"
            time.sleep(0.1)
        extra_env = {**env, "DDSTORE_HANDSHAKE_DIR": str(handshake_dir), "DDSTORE_HANDSHAKE_TIMEOUT_S": "60"}
        args = ("read", "--hs", str(handshake_dir), "--n-core", "2")
        extra = vc_start(vcluster, 2, 0, 1, 0, "m2_extra.py", *args, env=extra_env)
        ((rc, out, err),) = finish([extra], timeout=180, expect_ok=False)
        assert rc == 0 and "extra read ok" in out, f"extra job failed\n{out}\n{err}"
    finally:
        (handshake_dir / "STOP").touch()
        done = finish(core, timeout=120, expect_ok=False)
    for rc, out, err in done:
        assert rc == 0 and "core stopped" in out, f"{out}\n{err}"


def test_node_killed_mid_read(vcluster, handshake_dir):
    """Both ranks of node 1 are killed after everyone has read from them. Rank 0's reads from
    each raise DDStoreTimeoutError naming the dead rank within DDSTORE_TIMEOUT_S (+ slack), its
    own node still reads exactly. free() on both survivors (rank 1 never read from the dead
    node) cannot complete its barrier: it raises DDStoreTimeoutError within DDSTORE_TIMEOUT_S
    (+ slack) instead of hanging; rank 0's names the dead ranks."""
    timeout_s, handshake_s, slack = 5, 15, 15
    env = {
        "DDSTORE_FABRIC": "tcp",
        "DDSTORE_MPI": "0",
        "DDSTORE_TIMEOUT_S": str(timeout_s),
        "DDSTORE_HANDSHAKE_TIMEOUT_S": str(handshake_s),
    }
    args = ("dead", "--hs", str(handshake_dir))
    procs = [vc_start(vcluster, r // 2, r, 4, r % 2, "vc_job.py", *args, env=env) for r in range(4)]
    try:
        deadline = time.monotonic() + 120
        while len(list(handshake_dir.glob("vcready-*"))) < 4:
            assert time.monotonic() < deadline, "ranks did not get ready within 120 s"
            assert all(p.poll() is None for p in procs), finish(procs, expect_ok=False)
            time.sleep(0.1)
        killed = vcluster.kill_node(1)
        assert killed, "node 1 had no processes to kill"
        (handshake_dir / "node1-killed").touch()
        t0 = time.monotonic()
        survivors = finish(procs[:2], timeout=120, expect_ok=False)
        took = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    found = []
    for rc, out, err in survivors:
        assert rc == 0, f"a survivor failed\n{out}\n{err}"
        (r,) = reports(out, "vcjob")
        found.append(r)
    reader, freer = found
    for victim in ("2", "3"):
        t = reader["timeouts"][victim]
        assert f"rank {victim}" in t["msg"], t
        assert t["s"] <= timeout_s + slack, t
    assert reader["free_s"] <= timeout_s + slack and reader["free_error"], reader
    assert "2" in reader["free_error"] and "3" in reader["free_error"], reader
    assert freer["free_s"] <= timeout_s + slack and freer["free_error"], freer
    assert took < handshake_s + 2 * slack, took
    print(json.dumps(found))


def test_method0_across_nodes_refused_on_every_rank(vcluster):
    """Open MPI over TCP at MPI_THREAD_MULTIPLE has no window spanning nodes: add() refuses on
    every rank with DDStoreUnsupportedError naming the MPI, the reason and the alternatives,
    and leaves no variable behind."""
    out = vc_mpirun(vcluster, 2, "vc_job.py", "store", "--method", "0", "--expect", "refuse").stdout
    ranks = _one_per_rank(out, 4)
    assert len(ranks) >= 3, out  # Open MPI may drop a last line; most ranks report
    for r in ranks:
        msg = r["refused"]
        for part in ("MPI", "thread level multiple", "across nodes", "method=1", "OMPI_MCA_osc=sm,pt2pt"):
            assert part in msg, (part, msg)
        assert r["names_after"] == [], r


def test_method0_across_nodes_with_pt2pt_at_serialized(vcluster):
    """The alternative the refusal names: Open MPI's osc/pt2pt at thread level serialized;
    the same mixed, checked reads as method 1 (reads progress while the owner is in MPI)."""
    env = {"OMPI_MCA_osc": "sm,pt2pt", "VC_THREAD_LEVEL": "serialized"}
    out = vc_mpirun(vcluster, 2, "vc_job.py", "store", "--method", "0", env=env, timeout=300).stdout
    for r in _one_per_rank(out, 4):
        assert r["nodes"] == 2 and r["mismatches"] == 0, r
        assert r["same_node"] > 0 and r["remote"] > 0, r


def test_info_says_whether_method0_spans_nodes():
    """`python -m pyddstore info` answers for this MPI, thread level and network."""

    def info(extra):
        cmd = [sys.executable, "-m", "pyddstore", "info"]
        out = subprocess.run(
            cmd, env=_env(extra), capture_output=True, text=True, timeout=120, check=True
        ).stdout
        (line,) = [x for x in out.splitlines() if x.startswith("method 0 across nodes:")]
        return line

    line = info({"OMPI_MCA_osc": None, "DDSTORE_MPI_THREAD_LEVEL": None})
    if "Open MPI" not in subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout:
        assert "add() checks it" in line, line
        return
    if not os.path.isdir("/sys/class/infiniband") and not os.path.isdir("/sys/class/cxi"):
        assert line.startswith("method 0 across nodes: no:") and "method=1" in line, line
        line = info({"OMPI_MCA_osc": "sm,pt2pt", "DDSTORE_MPI_THREAD_LEVEL": "serialized"})
        assert "yes, through Open MPI osc/pt2pt at thread level serialized" in line, line


@pytest.mark.slow
def test_bench_over_the_virtual_cluster(tmp_path):
    """`python -m pyddstore bench --vcluster` (short): remote rows across two nodes beside one
    node; the bench checks the data it reads before timing."""

    reason = harness.why_unavailable()
    if reason:
        pytest.skip(reason)
    out_json = tmp_path / "vc.json"
    cmd = [
        sys.executable,
        "-m",
        "pyddstore",
        "bench",
        "--vcluster",
        "--row-sizes",
        "3072",
        "--batch-sizes",
        "128",
    ]
    cmd += [
        "--threads",
        "1",
        "--seconds",
        "0.05",
        "--rounds",
        "1",
        "--share-bytes",
        "1e6",
        "--json",
        str(out_json),
    ]
    env = {k: None for k in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")}
    proc = subprocess.run(cmd, env=_env(env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    results = json.loads(out_json.read_text())["results"]
    two = {(r["config"], r["kind"]) for r in results if r["placement"] == "two nodes"}
    assert {("ofi-tcp", "store"), ("mpi-rma", "store")} <= two, two
    assert all(r["us_per_row"] > 0 and r["gb_per_s"] > 0 for r in results)
    assert any("vs_one_node" in r for r in results), results


def _bridges() -> str:
    return subprocess.run(
        ["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True
    ).stdout


def test_teardown_after_sigterm_and_sweep_after_sigkill():
    """A harness process ended by SIGTERM removes its cluster itself; one killed with SIGKILL
    leaves it behind, and the next harness start (clean_stale) removes it and its processes."""
    import signal

    reason = harness.why_unavailable()
    if reason:
        pytest.skip(reason)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = subprocess.Popen(
            [sys.executable, str(harness.__file__), "up", "2", "2"], stdout=subprocess.PIPE, text=True
        )
        try:
            desc = json.loads(p.stdout.readline())
            nodes, bridges = desc["nodes"], desc["bridges"]
            # A process living on a node, as a rank would.
            sub = subprocess.Popen(["ip", "netns", "exec", nodes[1], "sleep", "300"])
            time.sleep(0.2)
            assert set(nodes) <= set(harness._netns_list())
            p.send_signal(sig)
            p.wait(timeout=30)
            if sig == signal.SIGKILL:
                assert set(nodes) <= set(harness._netns_list()), "SIGKILL leaves the cluster behind"
                assert nodes[0] in harness.clean_stale()
            assert not set(nodes) & set(harness._netns_list()), nodes
            assert not any(b in _bridges() for b in bridges), bridges
            assert not os.path.exists(desc["agent"]), "the rsh agent's directory must be removed"
            assert sub.wait(timeout=30) != 0, "the node's processes must be killed"
        finally:
            if p.poll() is None:
                p.kill()
