"""The applier role: feeds committed entries to the node's state machine, takes its snapshots,
and answers reads of it at a read index. Only a node started with `--state-machine` has one.

Why a process of its own: a slow state machine must never stall replication. The applier
reads the store like the dispatchers do (read-only mappings fenced by the store generation),
never writes the log, and owns only the `snapshot` group and its counters in the shared block.
A crash in user code stops this process with a one-line reason; the supervisor restarts it
(and stops the node if it crash-loops): the log stays as it was.

Start: restore the newest valid snapshot (an older one if the newest will not restore), then
replay the log after it (node.core.apply.replay_start). Loop: apply what is committed in runs
of at most MAX_APPLY_ENTRIES (NOOPs advance the applied index but are not passed to the user),
publish `applied_index`, send the results to the handler (which answers the appends that were
waiting for them), take a snapshot every `snapshot_threshold` entries, and answer parked
queries whose read index is applied.

Channels (node/wiring/channels.py): PULL `apply` (wake-ups from the handler when the committed index
moves; lost ones cost at most IDLE_POLL_MS), PUSH `results`, ROUTER `query`.

I/O is injectable (docs/contracts.md C7): the class builds no socket; `run()` sets a zmq `transport`
(results to the handler, replies to its queries) and loops calling `restore` once, then
`on_query` for each query frame and `tick` every turn; the simulator (tools/sim) sets its own
transport and `reader` and calls the same methods. Every time is `self.now()` (`rc.clock`).
"""

from __future__ import annotations

from typing import Protocol

import zmq

from ipc.sockets import recv_routed, send_routed
from node.core.apply import (
    ParkedQuery,
    ReplayGap,
    due_queries,
    next_run,
    replay_start,
    snapshot_due,
)
from node.core.membership import encode_configuration, is_configuration_body
from node.roles.runtime import RoleContext, role_main
from node.statemachine.api import CommittedEntry, StateMachine, check_results
from node.statemachine.loader import StateMachineSpecError, load_state_machine
from node.statemachine.snapshot_meta import (
    SnapshotChecksumMismatch,
    SnapshotChunkError,
    SnapshotError,
    SnapshotExists,
    SnapshotMeta,
)
from node.statemachine.snapshot_store import SnapshotStore
from node.store import codec
from node.store.reader import StaleRead, StoreReader
from node.wiring import channels

IDLE_POLL_MS = 100
SNAPSHOT_RETRY_MS = 10_000  # after a failed snapshot (disk full...), wait this long before retrying
MAX_READ_BYTES = 16 << 20


def _meta_config(meta: SnapshotMeta) -> tuple[int, bytes] | None:
    """(index, entry body) of the configuration a snapshot's meta records (validated when the
    meta was parsed), None when it records none."""
    c = meta.config()
    return None if c is None else (c.index, encode_configuration(c))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class ApplierTransport(Protocol):
    def results(self, frame: bytes) -> bool: ...  # False: dropped (the handler is not reading)
    def reply(self, ident: bytes, frame: bytes) -> None: ...  # to the handler that sent a query


class ZmqApplierTransport:
    """The real sockets: the `results` PUSH and the `query` ROUTER."""

    def __init__(self, results: zmq.Socket, query: zmq.Socket) -> None:
        self.results_sock, self.query_sock = results, query

    def results(self, frame: bytes) -> bool:
        try:
            self.results_sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def reply(self, ident: bytes, frame: bytes) -> None:
        send_routed(self.query_sock, ident, frame)


class Applier:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.cfg = rc.cfg
        self.log = rc.log
        self.state = rc.state
        try:
            self.sm: StateMachine = load_state_machine(self.cfg.state_machine,
                                                       self.cfg.state_machine_option_map())
        except StateMachineSpecError as e:
            rc.fatal(str(e))
        try:
            self.snaps = SnapshotStore(self.cfg.store_dir, max_snapshots_kept=self.cfg.max_snapshots_kept,
                                       wall_clock=rc.wall_clock)
        except SnapshotError as e:
            rc.fatal(f"snapshots: {e}")
        self.reader = StoreReader(self.cfg.store_dir)
        self.applied = -1
        self.applied_term = -1
        self.snapshot_index = -1
        self.snapshot_retry_ms = 0
        self.parked: list[ParkedQuery] = []
        self.receiver = None  # node.statemachine.snapshot_install.SnapshotReceiver of an install
        self.transport: ApplierTransport | None = None
        self._busy = False  # the last tick applied something: look again at once
        # The configuration in force at `applied` (index, entry body), recorded in each snapshot
        # taken (docs/membership.md "Snapshots and installs carry the configuration"): the
        # restored snapshot's, then each configuration entry applied. This process applies
        # every committed entry in order, so it knows it exactly; None: none yet (bootstrap).
        self.config: tuple[int, bytes] | None = None

    def now(self) -> int:
        return self.rc.clock()

    # ------------------------------------------------------------------ start
    def restore(self) -> None:
        """The newest snapshot that restores (damaged ones skipped with a warning); replay
        starts after it (`apply_some` checks the log still holds those entries)."""
        for snap in reversed(self.snaps.list()):
            try:
                self.snaps.verify(snap)
                with self.snaps.open_data(snap) as f:
                    self.sm.restore(f)
            except Exception as e:  # noqa: BLE001 - a damaged or unreadable snapshot: try an older one
                self.log.warning("snapshot at index %d (term %d) not restored, trying an older one: %s",
                                 snap.last_index, snap.last_term, _one_line(e))
                continue
            self.applied, self.applied_term = snap.last_index, snap.last_term
            self.snapshot_index = snap.last_index
            self.config = _meta_config(snap.meta)
            self.log.info("restored the snapshot at index %d (term %d, %d bytes)", snap.last_index,
                          snap.last_term, snap.size)
            break
        self.state.write_snapshot(snapshot_index=self.snapshot_index,
                                  snapshot_term=self.applied_term if self.snapshot_index >= 0 else -1)
        self.state.set("applied_index", self.applied)

    # ------------------------------------------------------------------ apply
    def apply_some(self) -> bool:
        """Apply one run of committed entries; True if anything was applied."""
        led = self.state.read_ledger()
        # Whatever there is to apply: unmap the files retention deleted, or the kernel cannot
        # give their space back while this process lives (found by the simulator).
        self.reader.follow_begin(led.ledger_begin_index)
        # The log must hold every entry after the snapshot, checked on every run and not only
        # at start: the roles start together, and a ledger the handler has not published yet
        # (end -1) says nothing, so a check at restore alone let a log that begins too late
        # stall the applier on stale reads for ever instead of stopping the node.
        try:
            replay_start(self.snapshot_index, led.ledger_begin_index, led.ledger_end_index)
        except ReplayGap as e:
            # A snapshot newer than ours may be on disk (installed by a leader while this
            # process restarted): restore it rather than give up.
            before = self.snapshot_index
            newest = self.snaps.list()
            if newest and newest[-1].last_index > before:
                self.log.info("%s; restoring the newer snapshot on disk", e)
                self.restore()
                if self.snapshot_index > before:
                    return False
            self.rc.fatal(f"state machine {self.cfg.state_machine}: {e}")
        run = next_run(self.applied, led.committed_index)
        if run is None:
            return False
        lo, hi = run
        gen = led.store_generation
        try:
            self.reader.begin(gen)
            entries: list[codec.Entry] = []
            i = lo
            while i <= hi:
                blob, n = self.reader.get_raw(i, led.ledger_end_index, hi - i + 1, MAX_READ_BYTES)
                entries.extend(e for _off, e in codec.iter_entries(blob))
                i += n
            self.reader.validate(gen)
        except (StaleRead, codec.CodecError) as e:
            self.log.debug("apply %d..%d: stale read, retrying: %s", lo, hi, e)
            return False
        user = [CommittedEntry(e.index, e.term, e.body) for e in entries if e.magic == codec.MAGIC_NORMAL]
        for e in entries:
            if is_configuration_body(e.magic, e.body):
                self.config = (e.index, bytes(e.body))
        try:
            results = check_results(user, self.sm.apply(user)) if user else []
        except Exception as e:
            self.log.error("state machine %s failed applying entries %d..%d: %s (the log is untouched; "
                           "the applier is restarted and replays from its last snapshot)",
                           self.cfg.state_machine, lo, hi, _one_line(e))
            raise
        by_index = dict(zip((e.index for e in user), results, strict=True))
        self.applied, self.applied_term = hi, entries[-1].term
        self.state.set("applied_index", hi)
        self.state.incr("entries_applied", len(entries))
        if self.transport is not None:
            frame = channels.encode_results(lo, [by_index.get(j) for j in range(lo, hi + 1)])
            if not self.transport.results(frame):
                self.log.warning("results of %d..%d dropped: the handler is not reading them", lo, hi)
        return True

    # ------------------------------------------------------------------ snapshots
    def maybe_snapshot(self, force: bool = False) -> None:
        if self.applied < 0 or self.applied == self.snapshot_index:
            return
        if force:
            self.snapshot_retry_ms = 0
        if not force and (not snapshot_due(self.applied, self.snapshot_index, self.cfg.snapshot_threshold)
                          or self.now() < self.snapshot_retry_ms):
            return
        t0 = self.now()
        try:
            pending = self.snaps.begin(self.applied, self.applied_term, self.cfg.state_machine,
                                       self.config)
            try:
                self.sm.snapshot(pending.file)
                snap = pending.commit()
            except BaseException:
                pending.abort()
                raise
        except SnapshotError as e:
            self.snapshot_retry_ms = self.now() + SNAPSHOT_RETRY_MS
            self.log.error("snapshot at index %d failed, retrying in %.0f s: %s", self.applied,
                           SNAPSHOT_RETRY_MS / 1000, e)
            return
        self.snapshot_index = snap.last_index
        self.state.write_snapshot(snapshot_index=snap.last_index, snapshot_term=snap.last_term)
        self.state.incr("snapshots_taken")
        self.log.info("snapshot at index %d (term %d): %d bytes in %d ms", snap.last_index, snap.last_term,
                      snap.size, self.now() - t0)

    # ------------------------------------------------------------------ queries
    def on_query(self, ident: bytes, frame: bytes) -> None:
        q = channels.decode_query(frame)
        if q is None:
            self.log.warning("malformed query frame (%d bytes) ignored", len(frame))
            return
        if q.kind == channels.QueryKind.SNAPSHOT:
            self.snapshot_now(ident, q.tag)
        elif q.kind == channels.QueryKind.INSTALL:
            self.on_install_chunk(ident, q.tag, q.request)
        else:
            self.parked.append(ParkedQuery(q.tag, q.read_index, q.request, ident))

    def snapshot_now(self, ident: bytes, tag: int) -> None:
        """`dledger snapshot`: everything applied so far (catch up first), snapshotted now."""
        while self.apply_some():
            pass
        self.maybe_snapshot(force=True)
        snap = self.state.read_snapshot()
        ok = snap.snapshot_index == self.applied
        status = channels.QUERY_OK if ok else channels.QUERY_FAILED
        answer = (channels.SNAPSHOT_POSITION.pack(snap.snapshot_index, snap.snapshot_term) if ok
                  else b"the snapshot failed: see the node's log")
        self.transport.reply(ident, channels.encode_query_reply(tag, status, self.applied, answer))

    # ------------------------------------------------------------------ install snapshot
    def on_install_chunk(self, ident: bytes, tag: int, request: bytes) -> None:
        """A chunk of the leader's snapshot (docs/snapshots.md "Install, end to end"), forwarded by
        the handler after it checked the leader and term. This process owns the snapshot directory
        (its writer lock), so it receives the bytes; once the last one is in and the checksum
        matches, it publishes the snapshot and restores the state machine from it, then answers
        `installed`: the handler resets the log to begin after it. Every step is idempotent: a chunk
        resent, a connection dropped, either process restarted — the leader's next probe finds the
        partial file (resumed) or the installed snapshot (answered installed)."""
        def answer(status: int, received: int, installed: bool = False, meta: SnapshotMeta | None = None,
                   reason: str = "") -> None:
            body = (reason.encode()[:255] if status == channels.QUERY_FAILED else
                    channels.INSTALL_PROGRESS.pack(received, 1 if installed else 0,
                                                   meta.last_index if meta else -1,
                                                   meta.last_term if meta else -1))
            self.transport.reply(ident, channels.encode_query_reply(tag, status, self.applied, body))

        chunk = channels.decode_install_chunk(request)
        try:
            meta = SnapshotMeta.from_json(chunk[0], "the leader's snapshot meta") if chunk else None
        except SnapshotError as e:
            meta, reason = None, str(e)
        else:
            reason = "malformed install chunk"
        if meta is None:
            answer(channels.QUERY_FAILED, 0, reason=reason)
            return
        _raw, offset, data = chunk
        if meta.state_machine != self.cfg.state_machine:
            answer(channels.QUERY_FAILED, 0, reason=f"the leader's snapshot is of state machine "
                   f"{meta.state_machine!r}, this node runs {self.cfg.state_machine!r}")
            return
        if meta.last_index <= self.applied:  # this state already reflects it (and more) ...
            self._abort_receive()
            if self.snapshot_index < meta.last_index:
                # ... but in memory only, and the handler resets the log to begin after the
                # leader's snapshot as soon as it hears `installed`: a restart rebuilds from the
                # newest snapshot on disk plus the log, so make this state durable first. Else
                # the log began after what that snapshot needs and the node stopped ("the log
                # begins at index 1200, but the state machine needs the entries from 1171"):
                # a store whose trimmed log was dropped for damage, repaired by an install while
                # this applier had applied past it from the old log.
                self.maybe_snapshot(force=True)
                if self.snapshot_index < meta.last_index:
                    answer(channels.QUERY_FAILED, 0, reason="the state covers the leader's snapshot "
                           "but could not be snapshotted here (see the node's log)")
                    return
            answer(channels.QUERY_OK, meta.size, True, meta)
            return
        try:
            if self.receiver is None or self.receiver.meta != meta:
                self._abort_receive()
                try:
                    self.receiver = self.snaps.receive(meta)
                except SnapshotExists:  # installed before a crash, not yet restored
                    self._restore_installed(meta)
                    answer(channels.QUERY_OK, meta.size, True, meta)
                    return
            rcv = self.receiver
            rcv.write_chunk(offset, data)
            if not rcv.complete:
                answer(channels.QUERY_OK, rcv.received_bytes(), False, meta)
                return
            t0 = self.now()
            try:
                rcv.install()
            except SnapshotExists:  # a valid copy appeared meanwhile: restore that one
                pass
            self.receiver = None
            self._restore_installed(meta)
            self.log.info("installed the leader's snapshot %d/%d (%d bytes) in %d ms; applied "
                          "index is now %d", meta.last_index, meta.last_term, meta.size,
                          self.now() - t0, self.applied)
            answer(channels.QUERY_OK, meta.size, True, meta)
        except SnapshotChunkError as e:
            answer(channels.QUERY_REFUSED, e.expected_offset or 0, False, meta)
        except SnapshotChecksumMismatch as e:
            self.log.warning("install of snapshot %d/%d: %s", meta.last_index, meta.last_term, e)
            answer(channels.QUERY_REFUSED, 0, False, meta)
        except SnapshotError as e:
            self.log.error("install of snapshot %d/%d failed: %s", meta.last_index, meta.last_term, e)
            self._abort_receive()
            answer(channels.QUERY_FAILED, 0, reason=str(e))

    def _abort_receive(self) -> None:
        if self.receiver is not None:
            self.receiver.abort()
            self.receiver = None

    def _restore_installed(self, meta: SnapshotMeta) -> None:
        """Replace the state machine's state by the installed snapshot `meta` names. A failure
        here (user code) stops the applier like a failed apply: it restarts from the newest
        snapshot on disk, which is this one."""
        snap = next((s for s in reversed(self.snaps.list()) if s.meta == meta), None)
        if snap is None:
            raise SnapshotError(f"installed snapshot {meta.name} is not in {self.snaps.dir}")
        with self.snaps.open_data(snap) as f:
            self.sm.restore(f)
        self.applied, self.applied_term = meta.last_index, meta.last_term
        self.snapshot_index = meta.last_index
        self.config = _meta_config(meta)
        self.state.write_snapshot(snapshot_index=meta.last_index, snapshot_term=meta.last_term)
        self.state.set("applied_index", self.applied)

    def answer_queries(self) -> None:
        if not self.parked:
            return
        ready, self.parked = due_queries(self.parked, self.applied)
        for q in ready:
            try:
                status, answer = channels.QUERY_OK, self.sm.query(q.request)
                if not isinstance(answer, bytes | bytearray | memoryview):
                    status, answer = channels.QUERY_FAILED, f"query returned {type(answer).__name__}".encode()
            except NotImplementedError as e:
                status, answer = channels.QUERY_UNSUPPORTED, _one_line(e).encode()[:255]
            except Exception as e:  # noqa: BLE001 - a read must not stop the applier
                status, answer = channels.QUERY_FAILED, _one_line(e).encode()[:255]
            self.state.incr("queries_served")
            self.transport.reply(q.reply_to, channels.encode_query_reply(q.tag, status, self.applied, bytes(answer)))

    # ------------------------------------------------------------------ loop
    def tick(self) -> None:
        """One loop turn besides sockets: apply a run, answer the reads it made due, snapshot."""
        self._busy = self.apply_some()
        self.answer_queries()
        self.maybe_snapshot()

    def next_wait_ms(self) -> int:
        """How long the loop may sleep: not at all while there is more to apply."""
        return 0 if self._busy else IDLE_POLL_MS

    def close(self) -> None:
        self.reader.close()
        self.snaps.close()
        try:
            self.sm.close()
        except Exception as e:  # noqa: BLE001 - closing must not hide why we stopped
            self.log.warning("state machine close failed: %s", _one_line(e))

    def run(self) -> None:
        rc = self.rc
        hints = rc.bell(channels.APPLY_BELL)
        query_sock = rc.open(channels.QUERY)
        self.transport = ZmqApplierTransport(rc.open(channels.RESULTS), query_sock)
        poller = zmq.Poller()
        for s in (hints.fd, query_sock, rc.wake_fd):
            poller.register(s, zmq.POLLIN)
        self.restore()
        try:
            while not rc.should_stop():
                self.tick()
                rc.beat()
                events = dict(poller.poll(self.next_wait_ms()))
                if rc.wake_fd in events:
                    rc.drain_wake()
                if hints.fd in events:
                    hints.drain()
                if query_sock in events:
                    while True:
                        try:
                            got = recv_routed(query_sock, zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if got is not None:
                            self.on_query(*got)
        finally:
            hints.close()
            self.close()


def main() -> int:
    return role_main("applier", lambda rc: Applier(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())
