"""learn_group_term (node/roles/group_term.py) against a real peer socket: how a new member
learns that its group is new, when the peers' handlers bind only after it first asked."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode
from ipc.sockets import router
from node.block.shared_state import LedgerView
from node.config import NodeConfig
from node.roles.group_term import learn_group_term
from node.store.term_vote import TermVoteFile
from node.wiring.ports import free_port_pairs

MAX_PASSES = 100  # loop passes (each at most a 10-100 ms poll) before the test gives up


@dataclass
class Peer:
    """A peer's handler that binds its data port only when told to, and answers METADATA as a
    member of a brand-new group (term 0, empty log)."""

    ctx: zmq.Context
    node_id: str
    port: int
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def bind(self) -> None:
        sock = router(self.ctx, f"tcp://127.0.0.1:{self.port}")

        def serve() -> None:
            with sock:
                while not self.stop.is_set():
                    if not sock.poll(10):
                        continue
                    ident, frame = sock.recv_multipart()
                    req = P.decode(frame)
                    sock.send_multipart([ident, P.encode(P.MetadataResponse(
                        int(ResponseCode.SUCCESS), req.group, 0, self_id=self.node_id,
                        request_id=req.request_id))])

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()


class FakeState:
    def read_ledger(self) -> LedgerView:
        return LedgerView(-1, -1, -1, -1)


@dataclass
class FakeRC:
    cfg: NodeConfig
    zctx: zmq.Context
    on_beat: object
    state: FakeState = field(default_factory=FakeState)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("test.group_term"))
    passes: int = 0

    def beat(self) -> None:
        self.passes += 1
        self.on_beat(self.passes)

    def should_stop(self) -> bool:
        return self.passes >= MAX_PASSES

    def peer_curve(self, _peer: str) -> None:
        return None  # plain mode, as RoleContext without a keys_dir


def test_a_request_that_could_not_be_sent_yet_is_retried_without_waiting_an_ask_interval(tmp_path):
    """The peers bind after our first attempt (a group starting together): the requests that
    could not be sent then are sent as soon as the connections are up. The ask clock is frozen,
    so waiting LOST_STATE_ASK_MS before asking again (what the loop used to do after a send
    that failed) never asks again and the member never decides."""
    ports = free_port_pairs(3)
    cfg = NodeConfig(id="n0", peers=";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports)),
                     store_dir=str(tmp_path))
    ctx = zmq.Context()
    peers = [Peer(ctx, f"n{i}", ports[i]) for i in (1, 2)]
    try:
        def on_beat(n: int) -> None:
            if n == 1:  # after the first pass, whose sends found no connection
                for p in peers:
                    p.bind()

        rc = FakeRC(cfg, ctx, on_beat)
        tv = TermVoteFile(str(tmp_path), tolerate_damage=True)
        assert tv.absent
        assert learn_group_term(rc, tv, lambda: 0) is True, f"undecided after {rc.passes} passes"
        assert rc.passes < MAX_PASSES
    finally:
        for p in peers:
            p.stop.set()
            if p.thread is not None:
                p.thread.join(timeout=5)
        ctx.destroy(linger=0)
