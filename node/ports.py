"""Free loopback ports for local groups and tests: each node needs `port` and `port + 1`."""

from __future__ import annotations

import socket


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port_pairs(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` ports p such that p and p + 1 are both free now (the kernel picks p; no time-derived
    or fixed ranges, so parallel runs do not collide)."""
    ports: list[int] = []
    held: list[socket.socket] = []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            p = s.getsockname()[1]
            if p < 65534 and p + 1 not in ports and p not in ports and p - 1 not in ports \
                    and _bindable(p + 1, host):
                ports.append(p)
            held.append(s)  # hold it so the kernel does not hand it out again meanwhile
    finally:
        for s in held:
            s.close()
    return ports
