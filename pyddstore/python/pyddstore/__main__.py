"""Command line: ``python -m pyddstore info`` | ``python -m pyddstore bench [...]``."""

from __future__ import annotations

import argparse
import os
import sys


def _rdma_devices() -> list[str]:
    """RDMA-capable devices here (InfiniBand/RoCE verbs, Slingshot cxi)."""
    found = []
    for cls in ("/sys/class/infiniband", "/sys/class/cxi"):
        try:
            found += sorted(os.listdir(cls))
        except OSError:
            pass
    return found


def method0_across_nodes(mpi_library: str) -> str:
    """Whether method 0 can span nodes here, from the MPI, the thread level pyddstore asks for
    and the network; add() settles it on every multi-node store (a probe window)."""
    if not mpi_library:
        return "no (no MPI library)"
    if "Open MPI" not in mpi_library:
        return "expected (this MPI serves windows across nodes itself); add() checks it"
    level = (os.environ.get("DDSTORE_MPI_THREAD_LEVEL") or "multiple").strip().lower()
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


def info() -> None:
    """Prints what this machine offers and what pyddstore would choose."""
    from . import _native
    from ._comm import _mpi_in_use, _torch_initialized
    from ._env import env_choice, env_flag, resolve_method

    sysinfo = _native.system_info()
    print(f"pyddstore {_native.__version__}")
    print(f"libfabric {sysinfo['libfabric_version']}")
    print("providers usable for one-sided reads (FI_EP_RDM, FI_RMA | FI_READ):")
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
    print(f"MPI: {sysinfo['mpi_library'].splitlines()[0] if sysinfo['mpi_library'] else 'not found'}")
    print(f"method 0 across nodes: {method0_across_nodes(sysinfo['mpi_library'])}")
    forced = env_choice("DDSTORE_COMM", ("mpi", "torch", "file"))
    if forced:
        comm = f"{forced} (DDSTORE_COMM)"
    elif env_flag("DDSTORE_MPI", True) and _mpi_in_use():
        comm = "mpi (MPI launcher or mpi4py detected)"
    elif _torch_initialized():
        comm = "torch.distributed default group"
    elif os.environ.get("DDSTORE_HANDSHAKE_DIR") or int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        comm = "file (handshake_dir)"
    else:
        comm = "single process"
    method = resolve_method(None)
    print("defaults here:")
    print(f"  communicator: {comm}")
    print(f"  method: {method if method is not None else '0 with MPI, else 1'}")
    print(f"  DDSTORE_FABRIC: {os.environ.get('DDSTORE_FABRIC') or 'cxi, else verbs, else tcp;ofi_rxm'}")
    print(f"  same-node shared memory: {'on' if env_flag('DDSTORE_SHM', True) else 'off'}")


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
