"""The peers string (DLedger's ``id-host:port;id-host:port``) and the limit on member ids.

Its own module, free of ZeroMQ and of the wire codec, because the processes that only read a
configuration (the CLI, `dledger cluster`, the supervisor) parse peers too, and importing the
socket helpers cost them ~35 ms of CPU each (zmq, the protocol, the security module) at every
node start (docs/performance.md "Start time"). `ipc.sockets` re-exports these names.
"""

from __future__ import annotations

MAX_STR = 64
"""Longest group / node id, in UTF-8 bytes (the wire codec's limit: ipc/protocol.py)."""


class PeersError(ValueError):
    """A --peers string that is not DLedger's ``id-host:port;id-host:port`` format."""


def parse_peers(peers: str) -> dict[str, tuple[str, int]]:
    """Parse DLedger's peers format into ``{id: (host, port)}``, keeping the given order.

    As in DLedger's MemberState, the id is everything before the first ``-`` (so ids cannot
    contain ``-``; hosts may). ``[::1]:20911`` style IPv6 hosts are accepted (brackets
    stripped). Empty items (a trailing ``;``) are ignored. Raises PeersError with the bad item.
    """
    out: dict[str, tuple[str, int]] = {}
    for raw in peers.split(";"):
        item = raw.strip()
        if not item:
            continue
        node_id, sep, addr = item.partition("-")
        if not sep or not node_id:
            raise PeersError(f"peer {item!r}: expected ID-HOST:PORT (e.g. n0-127.0.0.1:20911)")
        if len(node_id.encode("utf-8")) > MAX_STR:
            raise PeersError(f"peer {item!r}: id longer than {MAX_STR} bytes")
        host, colon, port_s = addr.rpartition(":")
        if not colon or not host:
            raise PeersError(f"peer {item!r}: missing HOST:PORT after the id")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            port = int(port_s)
        except ValueError:
            raise PeersError(f"peer {item!r}: port {port_s!r} is not a number") from None
        if not 1 <= port <= 65534:  # port + 1 is the elector port
            raise PeersError(f"peer {item!r}: port {port} outside 1..65534")
        if node_id in out:
            raise PeersError(f"peer id {node_id!r} appears twice")
        out[node_id] = (host, port)
    if not out:
        raise PeersError("no peers given (expected ID-HOST:PORT;ID-HOST:PORT...)")
    return out


def format_peers(peers: dict[str, tuple[str, int]]) -> str:
    """Inverse of parse_peers."""
    return ";".join(f"{i}-{host_literal(h)}:{p}" for i, (h, p) in peers.items())


def host_literal(host: str) -> str:
    """`host` as it goes in front of ``:port``: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
