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
    if hs or int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
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
    import sys

    mpi4py = sys.modules.get("mpi4py")
    if mpi4py is not None and "mpi4py.MPI" in sys.modules:
        return str(mpi4py.rc.thread_level), "mpi4py initialised MPI (mpi4py.rc.thread_level)"
    if s.is_set("mpi_thread_level"):
        return s.mpi_thread_level, "DDSTORE_MPI_THREAD_LEVEL, when pyddstore initialises MPI"
    return "multiple", "the default when pyddstore initialises MPI (mpi4py: mpi4py.rc.thread_level)"


def info() -> None:
    """Prints what this machine offers and what pyddstore would choose here, and why."""
    from . import _launch, _native
    from ._env import FABRICS
    from ._log import level_name

    s = _settings()
    sysinfo = _native.system_info()
    build = "with MPI" if _native.HAS_MPI else "without MPI (cargo feature mpi off)"
    print(f"pyddstore {_native.__version__}, built {build}: methods {', '.join(map(str, _native.METHODS))}")
    print(f"libfabric {sysinfo['libfabric_version']}")
    print("providers usable for one-sided reads (FI_EP_RDM, FI_RMA | FI_READ):")
    gather = s.remote_gather
    seen = set()
    for p in sysinfo["providers"]:
        key = (p["provider"], p["domain"])
        if key in seen:
            continue
        seen.add(key)
        print(
            f"  {p['provider']:<16} domain {p['domain']:<12} progress {p['progress']:<6} "
            f"max_msg {p['max_msg_size']:<12} mr_mode {'|'.join(p['mr_mode']) or '0'}"
        )
        if gather == "1":
            path = "gather (DDSTORE_REMOTE_GATHER=1; an error if it lacks tagged messages)"
        elif gather == "0":
            path = "one-sided (DDSTORE_REMOTE_GATHER=0)"
        elif p["gather_by_default"]:
            path = "gather: the owner answers one request per batch (DDSTORE_REMOTE_GATHER=auto)"
        else:
            path = "one-sided reads (DDSTORE_REMOTE_GATHER=auto)"
        print(f"    remote batches: {path}")
    print(f"  DDSTORE_FABRIC accepts {', '.join(FABRICS)}, or any libfabric provider name")
    if sysinfo["mpi_library"]:
        print(f"MPI: {sysinfo['mpi_library'].splitlines()[0]}")
    elif _native.HAS_MPI:
        print("MPI: not found")
    else:
        print("MPI: method 0 is not in this build (built without the cargo feature mpi)")
    print(f"method 0 across nodes: {method0_across_nodes(sysinfo['mpi_library'], s)}")
    launcher = _launch.detect()
    print(
        f"launcher: {launcher.name} ({launcher.source})"
        if launcher
        else "launcher: none (a plain process: no torchrun, mpirun, srun or PMI variables)"
    )
    comm, comm_why = _choose_comm(s)
    method, method_why = _choose_method(comm, s)
    provider, iface, provider_why = _choose_provider(sysinfo["providers"], s)
    level, level_why = _thread_level(s)
    print("what a store with comm=None, method=None would use here, and why:")
    print(f"  communicator: {comm}\n      because {comm_why}")
    print(f"  method: {method}\n      because {method_why}")
    print(f"  provider (methods 1, 2): {provider}\n      because {provider_why}")
    print(f"  interface: {iface}")
    print(f"  MPI thread level (method 0): {level}\n      because {level_why}")
    print(f"  same-node shared memory: {'on' if s.shm else 'off (DDSTORE_SHM=0)'}")
    print(f"  log level: {level_name()} (DDSTORE_LOG_LEVEL; logger 'pyddstore')")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m pyddstore")
    ap.add_argument(
        "command", choices=["info", "bench"], help="info: this machine; bench: the benchmark suite"
    )
    args, rest = ap.parse_known_args(argv)
    if args.command == "info":
        if rest:
            ap.error(f"info takes no arguments, got {rest}")
        info()
    else:
        from .bench import main as bench_main

        bench_main(rest)


if __name__ == "__main__":
    main()
