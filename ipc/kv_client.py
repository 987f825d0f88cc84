"""`KVClient`: the replicated KV store of a group started with `--state-machine kv`.

Every write is an append of a KV command (ipc/kv_format.py) through a `DLedgerClient`
with a session, so a write resent after a failover is applied once; its answer is what the
state machine returned when it applied it. Every read is a `query`: the leader confirms its
leadership with a heartbeat round and answers once its state machine has applied everything
committed when the read arrived (read-index), so reads are linearizable.

Revisions are log indexes (docs/statemachine.md): a key's `revision` is the index of the
entry that last changed it, and `put` returns the index its entry was committed at.

Bad input (empty key, a key over 4 KiB, a value over 1 MiB, not bytes) raises before anything
is sent: `TypeError` or `KVInputError` (a ValueError) with one line. What the group refuses or
cannot answer raises `DLedgerError` (see ipc/client/results.py); a result that cannot be known (its
entry was applied so long ago that the leader no longer holds its result) raises `KVError`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator, Mapping
from typing import Any

from ipc import kv_format as K
from ipc.client import DLedgerClient, QueryResult
from ipc.kv_format import KeyValue, KVInputError
from ipc.kv_watch import KVCompactedError, WatchEvent
from ipc.kv_watch import watch as _watch

__all__ = ["KVClient", "KVCompactedError", "KVError", "KVInputError", "KeyValue", "WatchEvent"]


class KVError(Exception):
    """The store refused an operation, or its outcome cannot be known. `status` is the KV
    status (ipc.kv_format.Status) when the store answered, else None."""

    def __init__(self, message: str, status: K.Status | None = None) -> None:
        super().__init__(message)
        self.status = status


class KVClient:
    """A thread-safe client of one group's KV store. Arguments as `DLedgerClient`'s."""

    def __init__(self, peers: str | Mapping[str, tuple[str, int]], group: str = "default",
                 timeout: float = 3.0, **options: Any) -> None:
        self.client = DLedgerClient(peers, group, timeout, **options)

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------ writes
    def _write(self, command: bytes, timeout: float | None,
               no_result: bool = False) -> tuple[K.KVResult | None, int]:
        r = self.client.append(command, timeout, no_result=no_result)
        if r.result is None:
            return None, r.index
        try:
            return K.decode_result(r.result), r.index
        except ValueError as e:
            raise KVError(f"the group's state machine is not the KV store: {e}") from None

    @staticmethod
    def _refused(res: K.KVResult) -> KVError:
        return KVError(f"{res.status.name}: {res.message}" if res.message else res.status.name, res.status)

    def put(self, key: bytes, value: bytes, timeout: float | None = None) -> int:
        """Set `key` to `value`; returns the new revision (the index of the entry).

        Answered at commit, not after the leader's state machine applied it (FLAG_NO_RESULT):
        a put that passed the input checks cannot fail in `apply`, and its revision is its
        index. A linearizable get after it still sees it (reads wait for their read index to
        be applied)."""
        res, index = self._write(K.encode_put(key, value), timeout, no_result=True)
        if res is None:
            return index  # a put always changes the key: its revision is its index
        if res.status != K.Status.OK:
            raise self._refused(res)
        return res.revision

    def _yes_no(self, command: bytes, no: K.Status, what: str, timeout: float | None) -> bool:
        """A write whose answer is OK (True) or `no` (False); its outcome must be known."""
        res, index = self._write(command, timeout)
        if res is None:
            raise KVError(f"{what} committed at index {index}, but its outcome is no longer known")
        if res.status == no:
            return False
        if res.status != K.Status.OK:
            raise self._refused(res)
        return True

    def delete(self, key: bytes, timeout: float | None = None) -> bool:
        """Remove `key`; True if it was there."""
        return self._yes_no(K.encode_delete(key), K.Status.NOT_FOUND, "delete", timeout)

    def cas(self, key: bytes, expected: bytes | None, value: bytes, timeout: float | None = None) -> bool:
        """Compare-and-set: set `key` to `value` only if its value is `expected` (None: only if
        the key is absent). True when it swapped."""
        return self._yes_no(K.encode_cas(key, expected, value), K.Status.CAS_FAILED, "cas", timeout)

    # ------------------------------------------------------------------ reads
    def _read(self, request: bytes, timeout: float | None, read_from: str | None = None) -> K.QueryReply:
        return _reply_of(self.client.query(request, timeout, read_from=read_from))

    def get(self, key: bytes, timeout: float | None = None, *, read_from: str | None = None) -> KeyValue | None:
        """The key's value and revision (`.value`, `.revision`), or None when it is absent.
        Linearizable: it reflects every write acknowledged before the call. `read_from`: the
        node that answers, any role (a follower read: `DLedgerClient.query`)."""
        return _item_of(self._read(K.encode_get(key), timeout, read_from))

    def get_async(self, key: bytes, timeout: float | None = None, *,
                  read_from: str | None = None) -> concurrent.futures.Future[KeyValue | None]:
        """`get` without waiting: the future resolves to what `get` returns (or raises).
        Many gets in flight on one client are pipelined (`DLedgerClient.query_async`)."""
        q = self.client.query_async(K.encode_get(key), timeout, read_from=read_from)
        out: concurrent.futures.Future[KeyValue | None] = concurrent.futures.Future()
        out.set_running_or_notify_cancel()

        def done(f: concurrent.futures.Future) -> None:  # on the client's I/O thread: cheap
            try:
                out.set_result(_item_of(_reply_of(f.result())))
            except Exception as e:  # noqa: BLE001 - handed to the caller through the future
                out.set_exception(e)

        q.add_done_callback(done)
        return out

    def scan(self, prefix: bytes = b"", limit: int | None = None, timeout: float | None = None, *,
             read_from: str | None = None) -> list[KeyValue]:
        """Every key starting with `prefix`, in key order (at most `limit`), read in pages of up
        to 10,000 keys; each page is linearizable on its own."""
        out: list[KeyValue] = []
        start = b""
        while limit is None or len(out) < limit:
            page = K.MAX_SCAN_LIMIT if limit is None else min(K.MAX_SCAN_LIMIT, limit - len(out))
            reply = self._read(K.encode_scan(prefix, page, start), timeout, read_from)
            out.extend(reply.items)
            if not reply.more or not reply.items:
                break
            start = reply.items[-1].key + b"\0"
        return out


    # ------------------------------------------------------------------ watch
    def watch(self, key: bytes, *, prefix: bool = False, start_revision: int | None = None,
              prev_kv: bool = False, timeout: float | None = None) -> Iterator[WatchEvent]:
        """Every change of `key` (with ``prefix=True``: of every key starting with it; b""
        watches all) in revision order, for ever: WatchEvent(type "PUT"/"DELETE", key,
        revision, kv, prev_kv). ``start_revision``: the first revision to report (resume
        from the last one seen + 1); None: changes after now. ``prev_kv``: also the key as it
        was before each change. A failed CAS or the delete of an absent key changes nothing
        and is not reported. Built on `DLedgerClient.follow`: across leader changes and
        restarts, no gap, no repeat (docs/statemachine.md "Watch").

        A past ``start_revision`` replays the log from its first entry; once retention removed
        that from every member the iteration raises `KVCompactedError` (etcd's ErrCompacted):
        scan, then watch from now. ``timeout`` bounds the seeding scan's reads."""
        return _watch(self.client, key, prefix, start_revision, prev_kv, timeout)

def _reply_of(q: QueryResult) -> K.QueryReply:
    """A KV query's answer, or KVError for an answer that is not one (another state machine)
    or a status other than OK / NOT_FOUND."""
    try:
        reply = K.decode_query_reply(q.answer)
    except ValueError as e:
        raise KVError(f"the group's state machine is not the KV store: {e}") from None
    if reply.status not in (K.Status.OK, K.Status.NOT_FOUND):
        raise KVError(f"{reply.status.name}: {reply.message}" if reply.message else reply.status.name,
                      reply.status)
    return reply


def _item_of(reply: K.QueryReply) -> KeyValue | None:
    return reply.items[0] if reply.status == K.Status.OK and reply.items else None
