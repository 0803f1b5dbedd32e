"""The benchmark on a virtual cluster (`python -m pyddstore bench --vcluster`, as root, not
under mpirun): remote rows read across two namespace "nodes" beside the same reads between two
ranks of one node, every line measured in the same run.

Each placement is one `mpirun` of `python -m pyddstore bench` through the repository's
harness (scripts/vcluster.py, or DDSTORE_VCLUSTER_HARNESS): two nodes x 1 rank (every row
rank 0 reads is on the other node) and one node x 2 ranks (the same rows through the
transport, `DDSTORE_SHM=0`, and through same-node memory). Method 0 across nodes runs with
Open MPI's osc/pt2pt at thread level serialized (the only one-sided component that spans
TCP nodes there); at the default level it is refused, which is reported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .._env import settings

# placement -> (nodes, ranks per node, [(configs, env)])
PT2PT = {"OMPI_MCA_osc": "sm,pt2pt", "MPI4PY_RC_THREAD_LEVEL": "serialized"}
PLACEMENTS = {
    "one node": (
        [0],
        2,
        [("ofi-tcp,mpi-rma,node-shm,mpi-shm", {})],
    ),
    "two nodes": (
        [0, 1],
        1,
        [("ofi-tcp", {}), ("mpi-rma", PT2PT)],
    ),
}


def load_harness():
    """scripts/vcluster.py of the source tree this package was built from (editable install),
    or the file DDSTORE_VCLUSTER_HARNESS names."""
    path = settings().vcluster_harness or str(Path(__file__).resolve().parents[4] / "scripts" / "vcluster.py")
    if not os.path.isfile(path):
        raise SystemExit(
            f"--vcluster needs the virtual-cluster harness; {path} does not exist: run from a source "
            "checkout (maturin develop) or set DDSTORE_VCLUSTER_HARNESS=/path/to/scripts/vcluster.py"
        )
    spec = importlib.util.spec_from_file_location("ddstore_vcluster", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ddstore_vcluster"] = mod
    spec.loader.exec_module(mod)
    return mod


def bench_args(args) -> list[str]:
    return [
        "--row-sizes",
        ",".join(map(str, args.row_sizes)),
        "--batch-sizes",
        ",".join(map(str, args.batch_sizes)),
        "--threads",
        ",".join(map(str, args.threads)),
        "--seconds",
        str(args.seconds),
        "--rounds",
        str(args.rounds),
        "--share-bytes",
        str(args.share_bytes),
    ]


def run(args) -> None:
    """Measures every placement, prints one table (and --json), beside the one-node figures."""
    harness = load_harness()
    reason = harness.why_unavailable()
    if reason:
        raise SystemExit(f"--vcluster: {reason}")
    if os.environ.get("OMPI_COMM_WORLD_SIZE"):
        raise SystemExit("--vcluster starts its own mpirun: run it as a plain process, not under mpirun")
    env = dict(os.environ)
    env.update(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1",
            "DDSTORE_QUIET": "1",
        }
    )
    results = []
    with harness.VCluster(2) as cluster, tempfile.TemporaryDirectory() as tmp:
        for placement, (nodes, per_node, runs) in PLACEMENTS.items():
            for configs, extra in runs:
                out = os.path.join(tmp, f"{len(nodes)}-{configs.replace(',', '_')}.json")
                inner = [sys.executable, "-m", "pyddstore", "bench", "--configs", configs, "--json", out]
                argv = cluster.mpirun_argv(per_node, inner + bench_args(args), env=extra, nodes=nodes)
                print(f"# {placement}: {configs} {extra or ''}", file=sys.stderr, flush=True)
                proc = subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, timeout=900)
                if proc.returncode != 0 or not os.path.exists(out):
                    raise SystemExit(
                        f"{placement} {configs} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
                    )
                with open(out) as f:
                    for r in json.load(f)["results"]:
                        if r["config"] != "numpy":
                            results.append({**r, "placement": placement, "settings": extra})
    add_ratio_to_one_node(results)
    print_table(results)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"vcluster": True, "results": results}, f, indent=1)


def add_ratio_to_one_node(results: list[dict]) -> None:
    """vs_one_node: time per row across nodes / the same config and line on one node."""
    key = lambda r: (r["config"], r["kind"], r["row_bytes"], r["batch"], r["threads"])  # noqa: E731
    one = {key(r): r for r in results if r["placement"] == "one node"}
    for r in results:
        base = one.get(key(r))
        if r["placement"] == "two nodes" and base:
            r["vs_one_node"] = r["us_per_row"] / base["us_per_row"]


def print_table(results: list[dict]) -> None:
    print("# pyddstore bench on a virtual cluster: rank 0 reads random rows of the other rank")
    print(
        f"{'placement':<10} {'config':<9} {'kind':<6} {'row B':>8} {'batch':>5} {'thr':>3} "
        f"{'us/row':>9} {'GB/s':>7} {'x 1 node':>8}"
    )
    for r in sorted(results, key=lambda r: (r["row_bytes"], r["batch"], r["config"], r["placement"])):
        ratio = f"{r['vs_one_node']:.2f}" if "vs_one_node" in r else "-"
        print(
            f"{r['placement']:<10} {r['config']:<9} {r['kind']:<6} {r['row_bytes']:>8} {r['batch']:>5} "
            f"{r['threads']:>3} {r['us_per_row']:>9.2f} {r['gb_per_s']:>7.2f} {ratio:>8}"
        )
    print(
        "# two nodes: mpi-rma runs with OMPI_MCA_osc=sm,pt2pt at thread level serialized; at the "
        "default level (multiple) method 0 across these nodes is refused (DDStoreUnsupportedError)"
    )
