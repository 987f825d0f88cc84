"""The DLedger client library: find the leader, append, read, inspect, transfer leadership.

Public API (docs/client.md)::

    from ipc.client import DLedgerClient, DLedgerError

    with DLedgerClient(peers="n0-127.0.0.1:20911;n1-127.0.0.1:20913", group="default",
                       timeout=3.0) as c:
        r = c.append(b"body")              # AppendResult(index, term, pos)
        rs = c.append_batch([b"a", b"b"])   # list[AppendResult], contiguous indexes
        f = c.append_async(b"x")            # concurrent.futures.Future[AppendResult]
        e = c.get(r.index)                  # Entry(index, term, pos, body, type)
        es = c.get_range(0, 100)            # list[Entry], committed entries only
        m = c.metadata()                    # Metadata(group, leader_id, term, nodes)
        c.transfer_leadership("n1")

How the package is cut (one job per module; docs/client.md explains the behaviour):

* ``api.py``: `DLedgerClient`, the facade callers use; it hands calls to the I/O thread.
* ``results.py``: result and error types, and turning a node's answer into one.
* ``calls.py``: the record of one request across its attempts, its wire encoding, backoff,
  and the in-flight bound.
* ``io_thread.py``: the one thread that owns the sockets: dispatch, send, receive, retry.
* ``connections.py``: the DEALER per node, its monitor, Lazy Pirate socket recreation.
* ``discovery.py``: which node leads, and the calls parked until one is known.
* ``sessions.py``: exactly-once appends (session stamps, resends, abandon and drain),
  socket-free.
* ``timers.py``: the I/O thread's deadlines.

`KVClient` and `KVError` (ipc/kv_client.py) are importable from here too. They are built on
`DLedgerClient`, so ipc.kv_client imports this package; importing it back eagerly would be an
import cycle, hence the lazy module `__getattr__` (PEP 562) below.
"""

from __future__ import annotations

from typing import Any

from ipc.client.api import (
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_TIMEOUT,
    DLedgerClient,
)
from ipc.client.calls import BACKOFF_BASE, BACKOFF_MAX
from ipc.client.follow import FetchResult
from ipc.client.results import (
    AppendResult,
    ClientClosedError,
    DLedgerError,
    DLedgerIndeterminateError,
    Entry,
    Metadata,
    NodeInfo,
    QueryResult,
)

_LAZY = frozenset({"KVClient", "KVError"})


def __getattr__(name: str) -> Any:
    """`KVClient`/`KVError` on first use: ipc.kv_client imports this package, not the reverse."""
    if name in _LAZY:
        from ipc import kv_client
        value = getattr(kv_client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AppendResult",
    "KVClient",
    "KVError",
    "QueryResult",
    "ClientClosedError",
    "DLedgerClient",
    "DLedgerError",
    "DLedgerIndeterminateError",
    "Entry",
    "FetchResult",
    "Metadata",
    "NodeInfo",
    "BACKOFF_BASE",
    "BACKOFF_MAX",
    "DEFAULT_ATTEMPT_TIMEOUT",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_TIMEOUT",
]
