"""The scale bench (python -m pyddstore.benchmarks.scale): real jobs of 2 and 4 store-only ranks,
each rank's descriptors, sockets, memory, threads and counted messages reported, every quantity
fitted against N; and the fit itself on quantities of known growth."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import _env
from pyddstore.benchmarks.scale import fit


@pytest.mark.parametrize(
    "model, f",
    [("const", lambda n: 7.0), ("log N", lambda n: 3 + 5 * n.bit_length()), ("N", lambda n: 40 + 2.5 * n)]
    + [("N log N", lambda n: n * (n.bit_length() - 1)), ("N^2", lambda n: 6 * n * n + 100)],
)
def test_fit_picks_the_growth_of_the_data(model, f):
    ns = [2, 4, 8, 16, 32, 64]
    got = fit(ns, [f(n) for n in ns])
    assert got["model"] == model, got
    assert got["16384"] == pytest.approx(f(16384), rel=0.05), got


def test_the_default_set_extrapolates_per_peer_costs_past_its_size():
    """tcp grows by 36 KiB and 2 descriptors per rank (a connection out, one in); past the default
    set of 1,024 live connections only tcp-bounded's 0.5 KiB per rank grows on."""
    from pyddstore.benchmarks.scale import DEFAULT_SET, with_default_set

    ns = [8, 16, 32, 64]
    tcp = {"fds": fit(ns, [30 + 2 * n for n in ns]), "uss_mib": fit(ns, [40 + 36 / 1024 * n for n in ns])}
    bounded = [{"n": n, "summary": {"fds": 40, "uss_mib": 40 + 0.5 / 1024 * n}} for n in ns]
    got = with_default_set({"tcp": {"fits": tcp}, "tcp-bounded": {"points": bounded}})
    assert got["fds"]["1024"] == pytest.approx(30 + 2 * 1024)
    assert got["fds"]["16384"] == pytest.approx(30 + 2 * (DEFAULT_SET + 1))  # bounded: no growth
    at_set = 40 + 36 / 1024 * (DEFAULT_SET + 1)
    assert got["uss_mib"]["16384"] == pytest.approx(at_set + 0.5 / 1024 * (16384 - DEFAULT_SET - 1), rel=1e-3)
    assert got["uss_mib"]["16384"] < 64 + 40  # per-peer memory under 64 MiB over the base
    assert with_default_set({"tcp": {"fits": tcp}}) is None


def test_scale_bench_runs_jobs_and_reports_every_rank(tmp_path):
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "-m", "pyddstore.benchmarks.scale", "--ranks", "2,4", "--configs", "tcp"]
    cmd += ["--rows", "16", "--batch", "8", "--json", str(out)]
    env = _env({"OMPI_COMM_WORLD_SIZE": None})
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    points = doc["configs"]["tcp"]["points"]
    assert [p["n"] for p in points] == [2, 4] and not any(p.get("failed") for p in points), points
    for p in points:
        assert len(p["ranks"]) == p["n"], p
        assert sorted(r["rank"] for r in p["ranks"]) == list(range(p["n"]))
        for r in p["ranks"]:
            # The store opened descriptors and sockets (tcp;ofi_rxm to every peer), and the first
            # batch held a row of every other rank (its rows checked by the rank).
            assert r["fds"] > r["before"]["fds"] and r["sockets"] > r["before"]["sockets"], r
            assert 0 < r["uss_mib"] <= r["pss_mib"] <= r["rss_mib"] and r["threads"] >= 2, r
            assert r["batch_rows"] == 8 and r["init_s"] > 0 and r["first_batch_s"] > 0, r
            if doc["counted"]["pmpi_count"]:  # mpicc built the PMPI shim: add() hands MPI something
                assert r["add"]["msgs"] > 0 and r["add"]["bytes"] > 0, r
        assert p["summary"]["fds"] == max(r["fds"] for r in p["ranks"]), p["summary"]
    fits = doc["configs"]["tcp"]["fits"]
    assert fits["fds"]["model"] in ("const", "log N", "N", "N log N", "N^2"), fits["fds"]
    assert fits["fds"]["16384"] >= fits["fds"]["1024"] > 0, fits["fds"]
    assert doc["columns"][0] == "config" and doc["rows"][0][:2] == ["tcp", 4], doc["rows"]
    assert "fit against N" in proc.stdout and "N=16384:" in proc.stdout, proc.stdout
    assert "descriptors per rank" in proc.stdout and "GiB per node of 8 ranks" in proc.stdout, proc.stdout


def test_idle_threads_are_timed_at_each_descriptor_count():
    """--idle-threads: a lone tcp store holding 64, 512 and 2,100 descriptors, its own threads
    (the silent-connection sweeper among them) listed with the CPU they used."""
    from pyddstore.benchmarks.scale import IDLE_FDS

    cmd = [sys.executable, "-m", "pyddstore.benchmarks.scale", "--idle-threads", "--idle-seconds", "0.3"]
    proc = subprocess.run(
        cmd, env=_env({"OMPI_COMM_WORLD_SIZE": None}), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "descriptors:" in line]
    assert len(lines) == len(IDLE_FDS), proc.stdout
    for want, line in zip(IDLE_FDS, lines):
        held = int(line.split("descriptors:")[0].replace(",", ""))
        assert want - 2 <= held <= want + 2, line
        assert "ddstore-silent" in line, line


@pytest.mark.slow
@pytest.mark.serial
def test_scale_bench_on_the_virtual_cluster(tmp_path):
    """--vcluster 2: the tcp job across two namespace nodes, its ranks reported like on one node."""
    from vc_fixture import harness

    reason = harness.why_unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "-m", "pyddstore.benchmarks.scale", "--ranks", "2,4", "--configs", "tcp"]
    cmd += ["--rows", "16", "--batch", "8", "--vcluster", "2", "--json", str(out)]
    proc = subprocess.run(cmd, env=_env({}), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    vc = json.loads(out.read_text())["vcluster"]
    assert vc["nodes"] == 2, vc
    points = vc["configs"]["tcp"]["points"]
    assert [p["n"] for p in points] == [2, 4] and not any(p.get("failed") for p in points), points
    for p in points:
        assert len(p["ranks"]) == p["n"] and all(r["fds"] > r["before"]["fds"] for r in p["ranks"]), p
    assert "(2 virtual nodes)" in proc.stdout, proc.stdout
