"""A silent-connection flood (tests/test_attacks.py), run as the unprivileged attacker user.

python silent_flood.py SECONDS N PORT...   opens N TCP connections (spread over the loopback
                                           PORTs), never sends a byte, holds them for SECONDS,
                                           then prints "flood opened A connected C
                                           closed_by_peer E": connections the owner accepted,
                                           and those it closed (EOF or reset) meanwhile
"""

import errno
import resource
import select
import socket
import sys
import time


def main():
    seconds, n, ports = float(sys.argv[1]), int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 64)), hard))
    socks = []
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", ports[i % len(ports)]))
        except BlockingIOError:
            pass
        except OSError as e:
            if e.errno != errno.EINPROGRESS:
                s.close()
                continue
        socks.append(s)
    end = time.monotonic() + seconds
    closed = set()
    while time.monotonic() < end:
        _, _, _ = select.select([], [], [], 0.2)
        for s in socks:
            if s.fileno() in closed:
                continue
            try:
                if s.recv(1, socket.MSG_PEEK) == b"":
                    closed.add(s.fileno())
            except BlockingIOError:
                pass
            except OSError:
                closed.add(s.fileno())
    connected = sum(1 for s in socks if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
    print(f"flood opened {len(socks)} connected {connected} closed_by_peer {len(closed)}", flush=True)
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
