#!/usr/bin/env python3
"""A virtual cluster on one machine: N "nodes", each a network namespace with its own
hostname (UTS namespace per process), loopback and an `eth0` on a private bridge, plus an
Open MPI rsh agent and a hostfile so `mpirun` launches across them.

    python scripts/vcluster.py up 3 [NICS]     # prints a JSON description, stays up
    python scripts/vcluster.py down NAME       # tears one cluster down
    python scripts/vcluster.py clean           # removes clusters whose creator is gone
    python scripts/vcluster.py run 2 -- CMD    # cluster up, CMD on the host, always down

Each node has `nics` interfaces (`eth0`, `eth1`, ...), interface k on bridge k with address
10.213.(7+k).(node+1)/24, like the several NICs of an HPC node. Every name carries the creating
process id and a random token (`ddsvc-<pid>-<token>-nI`, bridges `dvb<token>K`, veths
`dv<token>nIeK`), so parallel runs never collide and a later run removes what a killed one
left behind. The private subnets live only inside the namespaces (the bridges in the host
namespace have no address), so nothing here is reachable from, or routes to, any real network.
Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and `ip`/`unshare`.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "ddsvc-"
SUBNET_BASE = (10, 213, 7)  # 10.213.(7+k).0/24 for interface k, only inside our namespaces


def subnet_prefix(k: int) -> str:
    """First three octets of interface k's subnet."""
    a, b, c = SUBNET_BASE
    return f"{a}.{b}.{c + k}"


def _ip(*args: str, check: bool = True, ns: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def why_unavailable() -> str | None:
    """None when namespaces can be made here, else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "the virtual cluster needs root (network and UTS namespaces)"
    for tool in ("ip", "unshare", "mpirun"):
        if shutil.which(tool) is None:
            return f"the virtual cluster needs `{tool}` (apt-get install iproute2 util-linux openmpi-bin)"
    probe = f"{PREFIX}probe-{os.getpid()}-{secrets.token_hex(2)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    uts = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True, timeout=30)
    if uts.returncode != 0:
        return f"cannot create a UTS namespace here (unshare --uts): {uts.stderr.strip()}"
    return None


def _netns_list() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale() -> list[str]:
    """Removes clusters (namespaces, their processes and bridges) whose creating process is gone."""
    removed = []
    for ns in _netns_list():
        if not ns.startswith(PREFIX):
            continue
        parts = ns[len(PREFIX) :].split("-")
        if len(parts) < 2 or not parts[0].isdigit() or _pid_alive(int(parts[0])):
            continue
        _kill_ns(ns)
        _ip("netns", "del", ns, check=False)
        _del_bridges(parts[1])
        removed.append(ns)
    for workdir in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        parts = workdir.name[len(PREFIX) :].split("-")
        if workdir.is_dir() and parts[0].isdigit() and not _pid_alive(int(parts[0])):
            shutil.rmtree(workdir, ignore_errors=True)
    return removed


def _del_bridges(token: str) -> None:
    out = _ip("-o", "link", "show", "type", "bridge", check=False).stdout
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"dvb{token}"):
            _ip("link", "del", name, check=False)


def _kill_ns(ns: str, sig: int = signal.SIGKILL) -> list[int]:
    pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


AGENT = """#!/bin/sh
# Open MPI rsh agent of a virtual cluster: instead of ssh, enter the node's network namespace
# with its own hostname. Called as: agent HOST CMD...
host="$1"; shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0"; exec sh -c "$*"' "$host" "$@"
"""


@dataclass
class VCluster:
    """N virtual nodes; `nodes[i]` is both namespace name and hostname, `addrs[i]` its eth0 address."""

    n: int
    nics: int = 1
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    nodes: list[str] = field(default_factory=list)
    addrs: list[str] = field(default_factory=list)
    workdir: Path | None = None
    _up: bool = False

    def bridge(self, k: int = 0) -> str:
        return f"dvb{self.token}{k}"

    def subnet(self, k: int = 0) -> str:
        """Interface k's subnet (eth0's carries Open MPI's traffic)."""
        return f"{subnet_prefix(k)}.0/24"

    def addr(self, node: int, k: int = 0) -> str:
        """Node `node`'s address on interface `ethk`."""
        return f"{subnet_prefix(k)}.{node + 1}"

    @property
    def agent(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "rsh-agent.sh"

    def hostfile(self, slots: int = 2, nodes: list[int] | None = None) -> Path:
        assert self.workdir is not None
        idx = list(range(self.n)) if nodes is None else nodes
        path = self.workdir / f"hostfile-{'-'.join(map(str, idx))}-{slots}"
        path.write_text("".join(f"{self.nodes[i]} slots={slots}\n" for i in idx))
        return path

    def up(self) -> VCluster:
        if not 1 <= self.n <= 200 or not 1 <= self.nics <= 8:
            raise ValueError(f"n={self.n}, nics={self.nics}: expected 1..200 nodes of 1..8 NICs")
        clean_stale()
        atexit.register(self.down)
        self._up = True
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        return self

    def _make(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{self.token}-"))
        self.agent.write_text(AGENT)
        self.agent.chmod(stat.S_IRWXU)
        base = f"{PREFIX}{os.getpid()}-{self.token}"
        for k in range(self.nics):
            _ip("link", "add", self.bridge(k), "type", "bridge")
            _ip("link", "set", self.bridge(k), "up")
        for i in range(self.n):
            ns = f"{base}-n{i}"
            _ip("netns", "add", ns)
            self.nodes.append(ns)
            self.addrs.append(self.addr(i))
            _ip("link", "set", "lo", "up", ns=ns)
            for k in range(self.nics):
                host_end, nic = f"dv{self.token}n{i}e{k}", f"eth{k}"
                _ip("link", "add", host_end, "type", "veth", "peer", "name", nic, "netns", ns)
                _ip("link", "set", host_end, "master", self.bridge(k))
                _ip("link", "set", host_end, "up")
                _ip("addr", "add", f"{self.addr(i, k)}/24", "dev", nic, ns=ns)
                _ip("link", "set", nic, "up", ns=ns)

    def down(self) -> None:
        if not self._up:
            return
        self._up = False
        for ns in self.nodes:
            _kill_ns(ns)
            _ip("netns", "del", ns, check=False)
        _del_bridges(self.token)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> VCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def on_node(self, i: int, argv: list[str]) -> list[str]:
        """argv run on node i: in its namespace, with its hostname."""
        inner = "hostname " + shlex.quote(self.nodes[i]) + "; exec " + shlex.join(argv)
        return ["ip", "netns", "exec", self.nodes[i], "unshare", "--uts", "sh", "-c", inner]

    def mpirun_argv(
        self,
        per_node: int,
        argv: list[str],
        env: dict | None = None,
        nodes: list[int] | None = None,
        map_by: str = "node",
    ) -> list[str]:
        """`mpirun` across nodes (`per_node` ranks on each, placed round-robin over the nodes
        unless `map_by="slot"`), started on the first of `nodes`.

        Open MPI's out-of-band and TCP byte transfer use only the bridge's subnet; `env`
        is passed to every rank with -x (with FI_TCP_IFACE/FI_SOCKETS_IFACE=eth0)."""
        idx = list(range(self.n)) if nodes is None else nodes
        hostfile = self.hostfile(per_node, idx)
        env = {"FI_TCP_IFACE": "eth0", "FI_SOCKETS_IFACE": "eth0", **(env or {})}
        xs: list[str] = []
        for k, v in env.items():
            xs += ["-x", f"{k}={v}"]
        cmd = [
            "mpirun",
            "-n",
            str(per_node * len(idx)),
            "--hostfile",
            str(hostfile),
            "--map-by",
            map_by,
            "--bind-to",
            "none",
            "--mca",
            "plm_rsh_agent",
            str(self.agent),
            "--mca",
            "btl",
            "self,vader,tcp",
            "--mca",
            "btl_tcp_if_include",
            self.subnet(),
            "--mca",
            "oob_tcp_if_include",
            self.subnet(),
            *xs,
            *argv,
        ]
        return self.on_node(idx[0], cmd)

    def kill_node(self, i: int, sig: int = signal.SIGKILL) -> list[int]:
        """Kills every process on node i (the node is lost); returns their pids."""
        return _kill_ns(self.nodes[i], sig)

    def describe(self) -> dict:
        return {
            "nodes": self.nodes,
            "addrs": self.addrs,
            "bridges": [self.bridge(k) for k in range(self.nics)],
            "subnets": [self.subnet(k) for k in range(self.nics)],
            "agent": str(self.agent),
            "hostfile": str(self.hostfile()),
        }


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd = argv[0]
    if cmd == "clean":
        print(json.dumps({"removed": clean_stale()}))
        return 0
    reason = why_unavailable()
    if reason:
        print(f"vcluster: {reason}", file=sys.stderr)
        return 2
    if cmd == "up":
        c = VCluster(int(argv[1]) if len(argv) > 1 else 2, int(argv[2]) if len(argv) > 2 else 1).up()
        print(json.dumps(c.describe()), flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            c.down()
        return 0
    if cmd == "down":
        ns_prefix = argv[1].rsplit("-n", 1)[0]
        for ns in _netns_list():
            if ns.startswith(ns_prefix):
                _kill_ns(ns)
                _ip("netns", "del", ns, check=False)
        _del_bridges(ns_prefix.rsplit("-", 1)[-1])
        return 0
    if cmd == "run":
        n = int(argv[1])
        rest = argv[argv.index("--") + 1 :] if "--" in argv else argv[2:]
        with VCluster(n) as c:
            env = dict(os.environ, DDSVC_JSON=json.dumps(c.describe()))
            return subprocess.call(rest, env=env)
    print(f"vcluster: unknown command {cmd!r} (up, down, clean, run)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main(sys.argv[1:]))
