"""Free loopback ports for local groups and tests: each node needs `port` and `port + 1`.

Why not let the kernel pick (``bind(("127.0.0.1", 0))``)? Because the kernel picks from its
*ephemeral* range, the same pool it draws from for the local end of every outgoing
connection — and Linux hands odd ports to ``bind(0)`` and even ones to ``connect()``. So the
elector port ``p + 1`` of a kernel-picked ``p`` is exactly the kind of port the next
connection made on this machine takes as its source port. When that connection lives on
(a peer's dispatcher already talking to a node that started first), the elector can never
bind and its node never takes part in an election. A test suite that starts a few hundred
groups hit this about once in every few runs.

So the ports are drawn at random from *outside* the ephemeral range (read from
``/proc/sys/net/ipv4/ip_local_port_range``), where no outgoing connection ever lands, and each
candidate is checked by binding it. Random, not a fixed or time-derived base, so parallel runs
on one machine rarely try the same port, and when they do the bind check catches it.
"""

from __future__ import annotations

import ipaddress
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default, used when the file cannot be read
LOWEST = 10_000  # stay clear of the well-known and commonly configured service ports
MIN_POOL = 2_000  # below this many candidate ports, fall back to the kernel's choice
MAX_TRIES = 10_000


def elector_port(port: int) -> int:
    """The port a node's elector listens on: its data port + 1 (DLedger's rule, docs/operations.md).
    Nodes on one host therefore need data ports at least 2 apart."""
    return port + 1


def _same_host(host: str) -> str:
    """A host as compared for collisions: IP literals normalized, `localhost` as 127.0.0.1.
    (Other names are compared as written: resolving them here could hang on DNS.)"""
    h = host.strip().lower()
    if h == "localhost":
        return "127.0.0.1"
    try:
        return ipaddress.ip_address(h).compressed
    except ValueError:
        return h


def peers_problems(peers: str) -> list[str]:
    """Everything wrong with a peers string, one line each, naming both nodes of a collision:
    syntax, an id given twice, two nodes on one address, and a node whose data port is another
    node's elector port (`...:20911;...:20912`: n1 cannot listen, and n0's elector answers in
    its place). Checked before a server, a local group or a client starts."""
    from ipc.sockets import PeersError, parse_peers

    out: list[str] = []
    nodes: list[tuple[str, str, int, str]] = []  # (id, host, port, item as written)
    for raw in peers.split(";"):
        item = raw.strip()
        if not item:
            continue
        try:
            ((nid, (host, port)),) = parse_peers(item).items()
        except PeersError as e:
            out.append(str(e))
            continue
        nodes.append((nid, _same_host(host), port, item))
    if not nodes and not out:
        out.append("no peers given (expected ID-HOST:PORT;ID-HOST:PORT...)")
    seen: dict[str, str] = {}
    for nid, _host, _port, item in nodes:
        if nid in seen:
            out.append(f"id {nid} is given twice ({seen[nid]} and {item})")
        seen.setdefault(nid, item)
    for i, (a, ha, pa, item_a) in enumerate(nodes):
        for b, hb, pb, item_b in nodes[i + 1:]:
            if ha != hb or a == b:
                continue
            if pa == pb:
                out.append(f"{a} and {b} have the same address ({item_a}, {item_b})")
            elif pb == elector_port(pa) or pa == elector_port(pb):
                lo, hi = (a, b) if pb == elector_port(pa) else (b, a)
                lo_port = min(pa, pb)
                out.append(f"{hi}'s port {lo_port + 1} is {lo}'s elector port ({lo} listens on "
                           f"{lo_port} and {lo_port + 1}): give nodes on one host ports at least "
                           f"2 apart, e.g. {lo_port}, {lo_port + 2}, {lo_port + 4}")
    return out


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """(low, high) of the ports the kernel uses for the local end of outgoing connections."""
    try:
        low, high = (int(x) for x in path.read_text().split()[:2])
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (low, high) if 0 < low <= high <= 65535 else DEFAULT_EPHEMERAL


def candidate_bases(ephemeral: tuple[int, int]) -> list[range]:
    """Ranges of ports p such that neither p nor p + 1 is ephemeral (p + 1 must exist too)."""
    low, high = ephemeral
    below = range(LOWEST, max(LOWEST, low - 1))  # p + 1 <= low - 1
    above = range(max(LOWEST, high + 1), 65535)  # p + 1 <= 65535
    return [r for r in (below, above) if len(r) > 0]


def _bind(port: int, host: str) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
        return s
    except OSError:
        s.close()
        return None


def _pick(pool: list[range], rnd: random.Random) -> int:
    i = rnd.randrange(sum(len(r) for r in pool))
    for r in pool:
        if i < len(r):
            return r[i]
        i -= len(r)
    raise AssertionError("unreachable")


def free_port_pairs(n: int, host: str = "127.0.0.1",
                    ephemeral: tuple[int, int] | None = None) -> list[int]:
    """`n` ports p, none adjacent to another, such that p and p + 1 are both free now and
    outside the kernel's ephemeral range (see the module docstring for why)."""
    pool = candidate_bases(ephemeral or ephemeral_range())
    if sum(len(r) for r in pool) < MIN_POOL:
        return _kernel_picked_pairs(n, host)  # a machine whose ephemeral range is nearly all
    rnd = random.Random()  # seeded from os.urandom: independent across processes and runs
    ports: list[int] = []
    held: list[socket.socket] = []
    try:
        for _ in range(MAX_TRIES):
            if len(ports) == n:
                return ports
            p = _pick(pool, rnd)
            if any(abs(p - q) <= 1 for q in ports):
                continue
            a = _bind(p, host)
            b = _bind(p + 1, host) if a is not None else None
            for s in (a, b):
                if s is not None:
                    held.append(s)  # hold both until all are chosen
            if a is not None and b is not None:
                ports.append(p)
    finally:
        for s in held:
            s.close()
    if len(ports) == n:
        return ports
    raise OSError(f"found only {len(ports)} of {n} free port pairs on {host} after {MAX_TRIES} tries")


def _kernel_picked_pairs(n: int, host: str) -> list[int]:
    """The fallback: let the kernel pick p, check p + 1 (exposed to the race described above)."""
    ports: list[int] = []
    held: list[socket.socket] = []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            held.append(s)
            p = s.getsockname()[1]
            if p < 65535 and all(abs(p - q) > 1 for q in ports):
                nxt = _bind(p + 1, host)
                if nxt is not None:
                    held.append(nxt)
                    ports.append(p)
    finally:
        for s in held:
            s.close()
    return ports
