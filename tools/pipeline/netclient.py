"""What the network source, stream and sink ask of a group, in one place: the committed range
(`group_range`) and raw committed entries from any member (`fetch_blob`, one FETCH answer: the
client's follow machinery, without decoding entries into objects — `net_arrow` checks them as
arrays). An index below the group's begin raises DLedgerError named
INDEX_LESS_THAN_LOCAL_BEGIN, so the callers handle retention the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC

FETCH_BYTES = 4 << 20  # one answer's cap on the node (MAX_GET_BYTES)


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
    if lead is not None and lead.alive and lead.ledger_begin_index is not None and lead.ledger_begin_index >= 0:
        begin = lead.ledger_begin_index  # what the leader holds: every task can read it somewhere
    else:
        begin = m.lowest_begin()
    committed = max(n.committed_index for n in live)
    return GroupRange(begin, committed, m.leader_id)


def fetch_blob(client: DLedgerClient, index: int, count: int, read_from: str | None = None,
               timeout: float | None = None) -> tuple[bytes, str]:
    """One FETCH answer: committed entries from `index` in store format (at most `count`, and
    at most what one answer holds), and the member that answered — `read_from` if it answers,
    else any member (followers first: the leader's handler is the append path). The raw bytes
    are for `net_arrow.blob_to_batch`, which checks them as arrays. b"" when `index` is past
    the committed end (as the leader says); an index below every member's begin raises
    DLedgerError named INDEX_LESS_THAN_LOCAL_BEGIN."""
    from ipc.client import follow as follow_mod

    t = client.timeout if timeout is None else timeout
    rotation = follow_mod.MemberRotation(list(client.peers), lambda: client._io.discovery.leader, read_from)
    msg, node, _ = follow_mod.fetch_raw(client, index, count, FETCH_BYTES, 0, rotation,
                                        time.monotonic() + t, decode=False)
    blob = msg.entries
    return (blob if isinstance(blob, bytes) else bytes(blob)), node
