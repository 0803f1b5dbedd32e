"""Command line: ``python -m pyddstore info`` | ``python -m pyddstore bench [...]``."""

from __future__ import annotations

import argparse
import os
import sys

from ._log import _rdma_devices


def _settings():
    from ._env import settings

    return settings()


def method0_across_nodes(mpi_library: str, settings=None) -> str:
    """Whether method 0 can span nodes here, from the MPI, the thread level pyddstore asks for
    and the network; add() settles it on every multi-node store (a probe window)."""
    if not mpi_library:
        return "no (no MPI library)"
    if "Open MPI" not in mpi_library:
        return "expected (this MPI serves windows across nodes itself); add() checks it"
    level = (settings if settings is not None else _settings()).mpi_thread_level
    osc = os.environ.get("OMPI_MCA_osc", "")
    devices = _rdma_devices()
    if devices:
        return f"expected (Open MPI osc/rdma or osc/ucx over {', '.join(devices)}); add() checks it"
    if level != "multiple" and "pt2pt" in osc and not osc.startswith("^"):
        return (
            f"yes, through Open MPI osc/pt2pt at thread level {level} (OMPI_MCA_osc={osc}): "
            "reads from a rank complete only while it is inside MPI"
        )
    return (
        f"no: Open MPI without an RDMA network has no one-sided component for windows across "
        f"nodes at thread level {level} (osc/rdma needs RDMA, osc/pt2pt refuses multiple); "
        "use method=1, or OMPI_MCA_osc=sm,pt2pt with DDSTORE_MPI_THREAD_LEVEL=serialized"
    )


def _choose_comm(s) -> tuple[str, str]:
    """(communicator, why) that comm=None would resolve to here, without starting MPI."""
    from . import _launch, _native
    from ._comm import _mpi_in_use, _torch_initialized

    launcher = _launch.detect()
    forced = s.comm
    if forced:
        return forced, f"DDSTORE_COMM={forced}"
    if s.mpi and _mpi_in_use():
        if not _native.HAS_MPI:
            pass  # a build without MPI goes on to torch or files
        else:
            why = launcher.source if launcher and launcher.name != "torchrun" else "mpi4py imported"
            return "mpi (MPI.COMM_WORLD)", f"an MPI launcher or mpi4py is present ({why})"
    if _torch_initialized():
        return "torch.distributed default group", "torch.distributed is initialised"
    hs = s.handshake_dir or ""
    if hs or _launch.srun_tasks(launcher):
        where = f"handshake_dir {hs}" if hs else "no DDSTORE_HANDSHAKE_DIR: pass handshake_dir="
        ranks = f" ({launcher.source})" if launcher else ""
        return f"file ({where})", f"no MPI and no torch.distributed group{ranks}"
    if launcher is not None and launcher.size > 1:
        return "none: comm=None raises", str(_launch.no_group_error(launcher))
    return "single process", "no launcher says this job has more than one rank"


def _choose_method(comm: str, s) -> tuple[str, str]:
    from . import _native

    method = s.method
    if method is not None:
        if method not in _native.METHODS:
            return f"{method} (not in this build: a store raises)", "DDSTORE_METHOD"
        return str(method), "DDSTORE_METHOD"
    if comm.startswith("mpi"):
        return "0 (MPI RMA)", "the communicator is MPI and DDSTORE_METHOD is unset"
    return "1 (libfabric)", "the communicator is not MPI and DDSTORE_METHOD is unset"


def _choose_provider(available: list, s) -> tuple[str, str, str]:
    """(provider, interface, why) methods 1 and 2 would use."""
    from ._env import check_fabric

    value = s.fabric or ""
    candidates = check_fabric(s)
    names = [p["provider"] for p in available]
    chosen = next((c for c in candidates if c in names), None)
    how = (
        f"DDSTORE_FABRIC={value}" if value else f"DDSTORE_FABRIC unset: the first of {', '.join(candidates)}"
    )
    if chosen is None:
        return "none (a method-1 store raises)", "-", f"{how}; none is usable here"
    iface = os.environ.get("FABRIC_IFACE", "")
    if iface:
        where = f"{iface} (FABRIC_IFACE)"
    elif s.nic_map:
        where = f"from DDSTORE_NIC_MAP={s.nic_map} by local rank"
    else:
        env_var = {"tcp": "FI_TCP_IFACE", "sockets": "FI_SOCKETS_IFACE"}.get(chosen.split(";")[0])
        domains = sorted({p["domain"] for p in available if p["provider"] == chosen})
        if env_var and os.environ.get(env_var):
            where = f"{os.environ[env_var]} ({env_var})"
        else:
            where = f"the provider's first of {', '.join(domains)}"
    skipped = [c for c in candidates[: candidates.index(chosen)]]
    why = how + (f" ({', '.join(skipped)} not here)" if skipped else "")
    return chosen, where, why


def _thread_level(s) -> tuple[str, str]:
    from . import _native

    if not _native.HAS_MPI:
        return "no MPI", "this build has no MPI (cargo feature mpi off): no method 0"
    mpi4py = sys.modules.get("mpi4py")
    if mpi4py is not None and "mpi4py.MPI" in sys.modules:
        return str(mpi4py.rc.thread_level), "mpi4py initialised MPI (mpi4py.rc.thread_level)"
    if s.is_set("mpi_thread_level"):
        return s.mpi_thread_level, "DDSTORE_MPI_THREAD_LEVEL, when pyddstore initialises MPI"
    return "multiple", "the default when pyddstore initialises MPI (mpi4py: mpi4py.rc.thread_level)"


def human_bytes(n: int) -> str:
    """A byte count as people read it: 65536 -> "64 KiB"; 2**64 - 1 (no limit) -> "unlimited"."""
    if n >= (1 << 63):
        return "unlimited"
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= (1 << shift):
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def _linked_mpi(path: str) -> str | None:
    """The MPI library a shared object links (resolved by the dynamic loader: `ldd`), or None."""
    import re
    import subprocess

    try:
        out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        m = re.match(r"\s*(libmpi\w*\.so[.\d]*) => (\S+)", line)
        if m:
            return os.path.realpath(m.group(2))
    return None


def _mpi_pair() -> dict:
    """The MPI pyddstore links beside the one mpi4py was built against (the usual mismatch on a
    Cray: a pip wheel of mpi4py brings its own MPICH), without initialising MPI."""
    from . import _native

    native = _linked_mpi(_native.__file__)
    out = {"pyddstore_links": native, "mpi4py": None, "mpi4py_links": None, "match": None}
    try:
        import importlib.util

        spec = importlib.util.find_spec("mpi4py.MPI")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return out
    import mpi4py

    out["mpi4py"] = mpi4py.__version__
    out["mpi4py_links"] = theirs = _linked_mpi(spec.origin)
    if native and theirs:
        out["match"] = native == theirs
    return out


def _versions() -> dict:
    """Versions of what pyddstore runs with, read from package metadata (nothing imported)."""
    import platform
    from importlib import metadata

    from . import _native

    found = {"pyddstore": _native.__version__, "python": platform.python_version()}
    for dist in ("numpy", "torch", "mpi4py", "torch_geometric", "tqdm"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    found["libfabric"] = _native.system_info()["libfabric_version"]
    return found


def collect() -> dict:
    """What `python -m pyddstore info` reports, as data (`info --json` prints it)."""
    from . import _launch, _native
    from ._env import FABRICS
    from ._log import level_name

    s = _settings()
    sysinfo = _native.system_info()
    gather = s.remote_gather
    providers, seen = [], set()
    for p in sysinfo["providers"]:
        key = (p["provider"], p["domain"])
        if key in seen:
            continue
        seen.add(key)
        if gather == "1":
            path = "gather (DDSTORE_REMOTE_GATHER=1; an error if it lacks tagged messages)"
        elif gather == "0":
            path = "one-sided (DDSTORE_REMOTE_GATHER=0)"
        elif p["gather_by_default"]:
            path = "gather: the owner answers one request per batch (DDSTORE_REMOTE_GATHER=auto)"
        else:
            path = "one-sided reads (DDSTORE_REMOTE_GATHER=auto)"
        providers.append({**p, "max_msg": human_bytes(p["max_msg_size"]), "remote_batches": path})
    launcher = _launch.detect()
    comm, comm_why = _choose_comm(s)
    method, method_why = _choose_method(comm, s)
    provider, iface, provider_why = _choose_provider(sysinfo["providers"], s)
    level, level_why = _thread_level(s)
    fabric_env = _native.libfabric_env()
    return {
        "versions": _versions(),
        "build": {"mpi": bool(_native.HAS_MPI), "methods": list(_native.METHODS)},
        "providers": providers,
        "fabric_names": list(FABRICS),
        "mpi_library": sysinfo["mpi_library"].splitlines()[0] if sysinfo["mpi_library"] else None,
        "mpi": _mpi_pair(),
        "method0_across_nodes": method0_across_nodes(sysinfo["mpi_library"], s),
        "launcher": launcher._asdict() if launcher else None,
        "choice": {
            "communicator": {"value": comm, "why": comm_why},
            "method": {"value": method, "why": method_why},
            "provider": {"value": provider, "why": provider_why},
            "interface": iface,
            "mpi_thread_level": {"value": level, "why": level_why},
            "shm": bool(s.shm),
            "log_level": level_name(),
        },
        "libfabric_env": [
            {"name": name, "value": value, "set_by_pyddstore": here, "why": fabric_env["why"][name]}
            for name, (value, here) in fabric_env["variables"].items()
        ],
    }


def info(as_json: bool = False) -> None:
    """Prints what this machine offers and what pyddstore would choose here, and why."""
    report = collect()
    if as_json:
        import json

        print(json.dumps(report, indent=2))
        return
    v, build = report["versions"], report["build"]
    how = "with MPI" if build["mpi"] else "without MPI (cargo feature mpi off)"
    print(f"pyddstore {v['pyddstore']}, built {how}: methods {', '.join(map(str, build['methods']))}")
    print(f"libfabric {v['libfabric']}")
    others = ", ".join(
        f"{k} {v[k] or '-'}" for k in ("python", "numpy", "torch", "mpi4py", "torch_geometric")
    )
    print(f"versions: {others}")
    print("providers usable for one-sided reads (FI_EP_RDM, FI_RMA | FI_READ):")
    for p in report["providers"]:
        print(
            f"  {p['provider']:<16} domain {p['domain']:<12} progress {p['progress']:<6} "
            f"max_msg {p['max_msg']:<10} mr_mode {'|'.join(p['mr_mode']) or '0'}"
        )
        print(f"    remote batches: {p['remote_batches']}")
    print(f"  DDSTORE_FABRIC accepts {', '.join(report['fabric_names'])}, or any libfabric provider name")
    if report["mpi_library"]:
        print(f"MPI: {report['mpi_library']}")
    elif build["mpi"]:
        print("MPI: not found")
    else:
        print("MPI: method 0 is not in this build (built without the cargo feature mpi)")
    mpi = report["mpi"]
    if mpi["mpi4py"] is None:
        print("mpi4py: not installed")
    elif mpi["match"] is False:
        print(
            f"mpi4py {mpi['mpi4py']}: MISMATCH: mpi4py links {mpi['mpi4py_links']}, pyddstore links "
            f"{mpi['pyddstore_links']}; rebuild one against the other's MPI "
            "(MPICC=cc pip install --no-binary mpi4py --force-reinstall mpi4py on a Cray)"
        )
    elif mpi["match"]:
        print(f"mpi4py {mpi['mpi4py']}: the same MPI as pyddstore ({mpi['pyddstore_links']})")
    else:
        print(f"mpi4py {mpi['mpi4py']}: its MPI or pyddstore's could not be resolved (ldd)")
    print(f"method 0 across nodes: {report['method0_across_nodes']}")
    launcher = report["launcher"]
    print(
        f"launcher: {launcher['name']} ({launcher['source']})"
        if launcher
        else "launcher: none (a plain process: no torchrun, mpirun, srun or PMI variables)"
    )
    c = report["choice"]
    print("what a store with comm=None, method=None would use here, and why:")
    print(f"  communicator: {c['communicator']['value']}\n      because {c['communicator']['why']}")
    print(f"  method: {c['method']['value']}\n      because {c['method']['why']}")
    print(f"  provider (methods 1, 2): {c['provider']['value']}\n      because {c['provider']['why']}")
    print(f"  interface: {c['interface']}")
    level = c["mpi_thread_level"]
    if build["mpi"]:
        print(f"  MPI thread level (method 0): {level['value']}\n      because {level['why']}")
    else:
        print("  MPI thread level: no MPI (built without the cargo feature mpi)")
    print(f"  same-node shared memory: {'on' if c['shm'] else 'off (DDSTORE_SHM=0)'}")
    print(f"  log level: {c['log_level']} (DDSTORE_LOG_LEVEL; logger 'pyddstore')")
    print("libfabric variables (set by pyddstore when `import pyddstore` ran, unless already set):")
    for var in report["libfabric_env"]:
        who = "set by pyddstore" if var["set_by_pyddstore"] else "yours, kept"
        print(f"  {var['name']}={var['value']} ({who}): {var['why']}")


def _prog() -> str:
    """The name this command was invoked by, for usage lines: `pyddstore` (the console script)
    or `python -m pyddstore`."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m pyddstore" if name in ("", "__main__.py", "-c") else name


def main(argv=None) -> None:
    """`pyddstore` / `python -m pyddstore`: the `info` and `bench` sub-commands."""
    from . import _native

    argv = sys.argv[1:] if argv is None else argv
    prog = _prog()
    ap = argparse.ArgumentParser(prog=prog, description="pyddstore's command line")
    ap.add_argument("--version", action="version", version=f"pyddstore {_native.__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{info,bench}")
    p_info = sub.add_parser(
        "info",
        help="this machine: providers, MPI, versions, and what a store would choose here and why",
        description="What this machine offers (libfabric providers, the MPI library, versions) and what "
        "a store created here with comm=None, method=None would choose, each with the reason. Under a "
        "launcher (srun, mpirun, torchrun) only rank 0 prints unless --all-ranks is given.",
    )
    p_info.add_argument("--json", action="store_true", help="print the report as JSON")
    p_info.add_argument("--all-ranks", action="store_true", help="under a launcher, print on every rank")
    sub.add_parser(
        "bench",
        help="the benchmark suite (pyddstore.benchmarks.stores); `bench --help` lists its options",
        add_help=False,
    )
    if argv[:1] == ["bench"]:  # everything after `bench` is the benchmark's own
        from .benchmarks.stores import main as bench_main

        bench_main(argv[1:], prog=f"{prog} bench")
        return
    args = ap.parse_args(argv)
    from . import _launch

    launcher = _launch.detect()
    if launcher is not None and launcher.rank != 0 and not args.all_ranks:
        return  # one report per job, not one per rank interleaved
    info(as_json=args.json)


if __name__ == "__main__":
    main()
