"""`SessionWriter`: appends under session stamps the CALLER chooses, so a write can be resent
by another process — a restarted Spark driver, a retried job — and still be stored once.

Why this exists beside the client's own sessions (sessions.py): those stamps live in one
client's memory, so only that client's resends are deduplicated. A caller that records
(session, first seq) durably before sending can, after a crash, resend the same bodies under
the same stamps; the leader answers every stamp its log already holds with the original index
and writes nothing (docs/client.md "Sessions"). The Spark sink (tools/pipeline/sink.py) is
such a caller.

What a caller gets, precisely:

* `open_session()` asks the leader for a fresh session id (OPEN_SESSION). Nothing is stored.
* `append_batch(bodies, session, seq)` stamps the bodies `seq, seq+1, ...` in `session` and
  resends under exactly those stamps on a lost answer, a dead leader or a leader change, until
  the timeout. It never re-stamps: a session the leader cannot vouch for (SESSION_EXPIRED,
  SESSION_SEQ_TOO_OLD) ends the call with `DLedgerIndeterminateError` — another process may
  have written under that stamp — so a caller never stores a body twice by trusting this API.
* Batches of one session must be sent in seq order, the next after the previous one returned
  (or, after a crash, starting again from seq 1): the leader stores a seq only after the one
  before it, and answers a seq past the next expected one SESSION_SEQ_GAP (resent here).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ipc import protocol as P
from ipc.client.api import DLedgerClient
from ipc.client.calls import BATCH, OPEN, Call
from ipc.client.results import AppendResult, DLedgerError
from ipc.codes import ResponseCode as RC
from ipc.seq import seq_add

MAX_SEQ = 0xFFFFFFFF


class SessionWriter:
    """Stamped appends on an existing client (which stays the caller's to close).

    The client may have sessions on or off; stamps given here are never the client's own
    session, so they do not disturb its other appends.
    """

    def __init__(self, client: DLedgerClient) -> None:
        self.client = client

    def open_session(self, timeout: float | None = None) -> int:
        """A new session id from the leader (retried on other nodes within the timeout)."""
        c = self.client
        call = Call(OPEN, None, time.monotonic() + (c.timeout if timeout is None else timeout))
        sid = c._wait(c._submit(call), timeout)
        if not isinstance(sid, int) or sid == 0:
            raise DLedgerError(RC.UNKNOWN, f"OPEN_SESSION answered {sid!r}")
        return sid

    def append_batch(self, bodies: Sequence[bytes | bytearray | memoryview], session: int, seq: int,
                     timeout: float | None = None) -> list[AppendResult]:
        """Append `bodies` stamped (session, seq), (session, seq+1), ...; one AppendResult per
        body. A resend of stamps already stored returns their original indexes (`term`/`pos`
        are -1 when retention deleted the entries). Raises DLedgerError (indeterminate when
        any attempt, in this process or before, may have been stored)."""
        c = self.client
        bodies = list(bodies)
        if not bodies:
            raise DLedgerError(RC.REQUEST_WITH_EMPTY_BODYS, "empty batch")
        if not (0 < session <= MAX_SEQ) or not (0 < seq <= MAX_SEQ):
            raise DLedgerError(RC.UNEXPECTED_ARGUMENT, "session and seq must be 32-bit and > 0")
        for b in bodies:
            if not isinstance(b, (bytes, bytearray, memoryview)):
                raise TypeError(f"bodies must be bytes-like, not {type(b).__name__}")
        if len(bodies) > P.MAX_BATCH_COUNT:
            raise DLedgerError(RC.UNEXPECTED_ARGUMENT,
                               f"batch of {len(bodies)} exceeds {P.MAX_BATCH_COUNT} bodies")
        big = max(len(b) for b in bodies)
        if big > c.max_body_size:
            raise DLedgerError(RC.UNEXPECTED_ARGUMENT,
                               f"body of {big} bytes exceeds max_body_size {c.max_body_size}")
        call = Call(BATCH, bodies, time.monotonic() + (c.timeout if timeout is None else timeout))
        call.sid, call.seq, call.fixed = session, seq, True
        return c._wait(c._submit(call), timeout)


def next_seq(seq: int, count: int) -> int:
    """The seq after `count` entries stamped from `seq` (seqs wrap like the node's)."""
    return seq_add(seq, count)
