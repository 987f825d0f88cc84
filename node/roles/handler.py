"""The handler role: the store's single writer and the node's data port.

It opens (and so recovers) the store, publishes ledger begin/end/term and the committed index
to the shared block, and serves the data port: client requests (APPEND, BATCH_APPEND, GET,
METADATA, LEADERSHIP_TRANSFER) and the leader's pushes. Every frame is untrusted: anything that
does not decode, or names another group or member, gets an error reply with a code and is
counted — the loop never dies of input (circus's `controller.dispatch`, SPEC §7).

A store that refuses to open (a damaged committed entry) is fatal: the process exits with
EXIT_FATAL and the supervisor stops the node with that message instead of restarting it.
"""

from __future__ import annotations

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from ipc.sockets import data_address, recv_routed, router, send_routed
from node.roles.runtime import RoleContext, role_main
from node.roles.supervisor import EXIT_FATAL
from node.shared_state import NO_SLOT
from node.store.base import StoreCorruptError, StoreError
from node.store.segment_store import SegmentStore

MAX_GET_BYTES = 4 << 20


class Handler:
    def __init__(self, rc: RoleContext) -> None:
        self.rc = rc
        self.cfg = rc.cfg
        self.log = rc.log
        self.state = rc.state
        self.peer_ids = self.cfg.peer_ids
        self.peer_map = self.cfg.peer_map
        self.store = SegmentStore(self.cfg.store_config())
        self.sock: zmq.Socket | None = None

    # ------------------------------------------------------------------ state helpers
    def publish_ledger(self) -> None:
        s = self.store
        self.state.write_ledger(ledger_begin_index=s.ledger_begin_index, ledger_end_index=s.ledger_end_index,
                                ledger_end_term=s.ledger_end_term, committed_index=s.committed_index)

    def _slot_id(self, slot: int) -> str:
        return self.peer_ids[slot] if 0 <= slot < len(self.peer_ids) else ""

    def _reply(self, ident: bytes, msg: P.Message) -> None:
        send_routed(self.sock, ident, P.encode(msg))

    def _error(self, ident: bytes, req: P.Message | bytes, code: RC, reason: str = "") -> None:
        m = self.state.read_member()
        self._reply(ident, P.error_reply(req, code, group=self.cfg.group, term=m.current_term,
                                         leader_id=self._slot_id(m.leader_slot), reason=reason))

    # ------------------------------------------------------------------ requests
    def handle_frame(self, ident: bytes, frame: bytes) -> None:
        try:
            msg = P.decode(frame, max_frame=self.cfg.max_frame_size, max_body=self.cfg.max_body_size)
        except P.ProtocolError as e:
            self.state.incr("bad_frames")
            self._error(ident, frame, RC.UNEXPECTED_ARGUMENT, str(e)[:200])
            return
        if P.is_response(msg) or not hasattr(msg, "group"):
            self.state.incr("bad_frames")
            self._error(ident, msg, RC.UNEXPECTED_ARGUMENT, "not a request")
            return
        if msg.group != self.cfg.group:
            self.state.incr("bad_frames")
            self._error(ident, msg, RC.UNKNOWN_GROUP, f"this is group {self.cfg.group!r}")
            return
        if msg.remote_id != self.cfg.id:
            self.state.incr("bad_frames")
            self._error(ident, msg, RC.UNKNOWN_MEMBER, f"this is {self.cfg.id!r}")
            return
        fn = self._dispatch.get(type(msg))
        if fn is None:
            self._error(ident, msg, RC.UNSUPPORTED, f"{type(msg).__name__} is not served on the data port")
            return
        fn(self, ident, msg)

    def on_metadata(self, ident: bytes, req: P.MetadataRequest) -> None:
        m = self.state.read_member()
        led = self.state.read_ledger()
        peers = []
        for slot, pid in enumerate(self.peer_ids):
            host, port = self.peer_map[pid]
            match = led.ledger_end_index if pid == self.cfg.id else self.state.read_peer(slot).match_index
            peers.append(P.PeerInfo(pid, f"{host}:{port}", match))
        self._reply(ident, P.MetadataResponse(
            RC.SUCCESS, self.cfg.group, m.current_term, self._slot_id(m.leader_slot), self.cfg.id,
            Role(m.role), led.ledger_begin_index, led.ledger_end_index, led.committed_index, peers,
            req.request_id))

    def on_get(self, ident: bytes, req: P.GetRequest) -> None:
        """Committed entries only, a range per request (DLedger returns one, unchecked)."""
        m = self.state.read_member()
        if m.role != Role.LEADER:
            self._error(ident, req, RC.NOT_LEADER)
            return
        s = self.store
        if req.count <= 0 or req.index < 0:
            self._error(ident, req, RC.UNEXPECTED_ARGUMENT, "index must be >= 0 and count > 0")
            return
        if s.ledger_begin_index < 0 or req.index < s.ledger_begin_index or req.index > s.committed_index:
            self._error(ident, req, RC.INDEX_OUT_OF_RANGE,
                        f"committed range is [{s.ledger_begin_index}, {s.committed_index}]")
            return
        parts, i, left, size = [], req.index, min(req.count, s.committed_index - req.index + 1), 0
        try:
            while left > 0 and size < MAX_GET_BYTES:
                blob, n = s.get_raw(i, left, MAX_GET_BYTES - size)
                parts.append(bytes(blob))
                size += len(blob)
                i += n
                left -= n
        except StoreError as e:
            self._error(ident, req, RC[e.code_name], str(e)[:200])
            return
        self._reply(ident, P.GetResponse(RC.SUCCESS, self.cfg.group, m.current_term,
                                         self._slot_id(m.leader_slot), b"".join(parts), req.request_id))

    def on_append(self, ident: bytes, req: P.AppendRequest | P.BatchAppendRequest) -> None:
        m = self.state.read_member()
        if m.role != Role.LEADER:
            self._error(ident, req, RC.NOT_LEADER)
            return
        self._error(ident, req, RC.UNSUPPORTED, "replication is not built yet")

    _dispatch = {
        P.MetadataRequest: on_metadata,
        P.GetRequest: on_get,
        P.AppendRequest: on_append,
        P.BatchAppendRequest: on_append,
    }

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        rc = self.rc
        try:
            self.store.open()
        except StoreCorruptError as e:
            self.log.error("%s", e)
            raise SystemExit(EXIT_FATAL) from None
        try:
            self.publish_ledger()
            host, port = self.cfg.address
            self.sock = router(rc.zctx, data_address(host, port), max_msg_size=self.cfg.max_frame_size)
            rc.beat()  # first beat = "ledger published": the elector waits for it before voting
            self.log.info("serving on %s:%d; ledger begin=%d end=%d term=%d committed=%d", host, port,
                          self.store.ledger_begin_index, self.store.ledger_end_index,
                          self.store.ledger_end_term, self.store.committed_index)
            poller = zmq.Poller()
            poller.register(self.sock, zmq.POLLIN)
            while not rc.should_stop():
                events = dict(poller.poll(500))
                if self.sock in events:
                    for _ in range(256):  # drain a burst, then beat and re-check the stop flag
                        try:
                            got = recv_routed(self.sock, zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if got is not None:
                            self.handle_frame(*got)
                rc.beat()
        finally:
            self.store.close()


def main() -> int:
    return role_main("handler", lambda rc: Handler(rc).run())


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["Handler", "NO_SLOT", "main"]
