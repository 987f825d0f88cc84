"""What the network source, stream and sink ask of a group, in one place: the committed range,
and `fetch` (committed entries from any member).

`fetch` follows `DLedgerClient.fetch` (FetchResult: entries, committed_index, begin_index,
node). A client without that method gets the same contract from `get_range`, which only the
leader serves: `read_from` is then ignored and `node` is the leader's id. Either way an index
below the group's begin raises DLedgerError named INDEX_LESS_THAN_LOCAL_BEGIN, so the callers
handle retention the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ipc.client import DLedgerClient, DLedgerError, Entry
from ipc.codes import ResponseCode as RC


@dataclass(frozen=True, slots=True)
class FetchResult:
    entries: list[Entry]
    committed_index: int
    begin_index: int
    node: str


@dataclass(frozen=True, slots=True)
class GroupRange:
    """The group's log as one METADATA round saw it: `begin` the first index still held
    (the leader's begin; else the smallest any live member reports), `committed` the highest
    index any live member reports committed (a committed index is committed everywhere, so
    the highest report is safe to read up to), `leader` its id or None."""

    begin: int
    committed: int
    leader: str | None


def group_range(client: DLedgerClient, timeout: float | None = None) -> GroupRange:
    """One METADATA round; raises DLedgerError(TIMEOUT) when no member answers."""
    m = client.metadata(timeout)
    live = [n for n in m.nodes if n.alive and n.committed_index is not None]
    if not live:
        raise DLedgerError(RC.TIMEOUT, "no member of the group answered METADATA")
    lead = m.node(m.leader_id) if m.leader_id else None
    begins = [n.ledger_begin_index for n in live if n.ledger_begin_index is not None
              and n.ledger_begin_index >= 0]
    if lead is not None and lead.alive and lead.ledger_begin_index is not None and lead.ledger_begin_index >= 0:
        begin = lead.ledger_begin_index
    else:
        begin = min(begins) if begins else 0
    committed = max(n.committed_index for n in live)
    return GroupRange(begin, committed, m.leader_id)


def fetch(client: DLedgerClient, index: int, *, max_entries: int = 1000, max_bytes: int = 1 << 20,
          wait_ms: int = 0, read_from: str | None = None, timeout: float | None = None) -> FetchResult:
    """Committed entries from `index` (consecutive; empty: none committed there within
    `wait_ms`). See the module docstring."""
    native = getattr(client, "fetch", None)
    if native is not None:
        r = native(index, max_entries=max_entries, max_bytes=max_bytes, wait_ms=wait_ms,
                   read_from=read_from, timeout=timeout)
        return FetchResult(list(r.entries), r.committed_index, r.begin_index, r.node)
    deadline = time.monotonic() + (client.timeout if timeout is None else timeout)
    wait_until = time.monotonic() + wait_ms / 1000.0
    while True:
        try:
            entries = client.get_range(index, max_entries, max(0.001, deadline - time.monotonic()))
        except DLedgerError as e:
            if e.code != RC.INDEX_OUT_OF_RANGE:
                raise
            rng = group_range(client, max(0.001, deadline - time.monotonic()))
            if index < rng.begin:
                raise DLedgerError(RC.INDEX_LESS_THAN_LOCAL_BEGIN,
                                   f"index {index} is below the group's begin {rng.begin}") from None
            if index <= rng.committed and time.monotonic() < deadline:
                continue  # committed meanwhile (or a new leader): ask again
            if time.monotonic() < min(wait_until, deadline):
                time.sleep(0.005)  # polling the committed end (no wait on the server yet)
                continue
            return FetchResult([], rng.committed, rng.begin, rng.leader or "")
        # get_range does not say the committed end or begin: the last entry is a lower bound
        # of the one, and -1 stands for "not reported" for the other.
        return FetchResult(entries, entries[-1].index if entries else -1, -1, _leader(client))


def _leader(client: DLedgerClient) -> str:
    """The leader the client talks to (the adapter's answering node), best effort."""
    io = getattr(client, "_io", None)
    return getattr(getattr(io, "discovery", None), "leader", None) or ""


def get_blob(client: DLedgerClient, index: int, count: int, timeout: float | None = None) -> tuple[bytes, str]:
    """One GET answer from the leader: committed entries from `index` in store format (at most
    `count`, and at most what one answer holds), and the node that answered. The raw bytes are
    for `net_arrow.blob_to_batch`, which checks them as arrays. Raises like `fetch` (an index
    below the group's begin: INDEX_LESS_THAN_LOCAL_BEGIN); b"" when `index` is past the
    committed end."""
    from ipc.client.calls import GET, Call

    t = client.timeout if timeout is None else timeout
    deadline = time.monotonic() + t
    while True:
        call = Call(GET, (index, count, False), deadline)
        try:
            resp = client._wait(client._submit(call), max(0.001, deadline - time.monotonic()))
        except DLedgerError as e:
            if e.code != RC.INDEX_OUT_OF_RANGE:
                raise
            rng = group_range(client, max(0.001, deadline - time.monotonic()))
            if index < rng.begin:
                raise DLedgerError(RC.INDEX_LESS_THAN_LOCAL_BEGIN,
                                   f"index {index} is below the group's begin {rng.begin}") from None
            if index <= rng.committed and time.monotonic() < deadline:
                continue  # committed meanwhile, or asked a new leader that is catching up
            return b"", rng.leader or ""
        blob = resp.entries
        return (blob if isinstance(blob, bytes) else bytes(blob)), _leader(client)
