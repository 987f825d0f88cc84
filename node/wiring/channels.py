"""The node's channels, declared once: endpoints, socket types, who binds, message formats.

`shared_state.py` declares the block every role reads; this module declares every socket a role
opens, so no role module imports another to find a peer's endpoint or a message layout (the
roles are separate processes: what they share is this contract, not code).

Wake-up channels carry hints only. The truth is in the shared block and the store, so a lost or
duplicated wake-up costs latency, never correctness (docs/contracts.md C24).

| channel | endpoint | binder (type) | connectors (type) | message |
|---|---|---|---|---|
| data port | tcp host:port | handler (ROUTER) | clients, peers' dispatchers, handlers (follower reads) and electors (lost term/vote file) (DEALER) | `ipc.protocol` frames |
| elector port | tcp host:port+1 | elector (ROUTER) | peers' electors (DEALER) | `ipc.protocol` VOTE / HEARTBEAT / TAKE_LEADERSHIP |
| role | ipc elector.pub | elector (PUB) | handler, dispatchers, ack checker, `node.wiring.listeners` (SUB) | `ROLE_MSG`: role, term, leader slot, role epoch |
| control | ipc elector.ctl | elector (ROUTER) | handler (DEALER) | `ipc.protocol` LEADERSHIP_TRANSFER (answered with TRANSFER_RESPONSE), or `CONFIRM_LEADERSHIP` (answered with `LEADERSHIP_CONFIRMED` once a quorum round that started after it landed: a wake-up; the block's quorum-heartbeat time is the answer) |
| results | ipc results.pull | handler (PULL) | applier (PUSH) | `encode_results`: what `apply` returned for a run of indexes |
| query | ipc query.router | applier (ROUTER) | handler (DEALER) | `encode_query` / `encode_query_reply`: a `QueryKind` byte first: a read of the state machine at a read index, a snapshot now, or a chunk of a snapshot to install |

The last two exist only on a node with a state machine (docs/statemachine.md).

Wake-ups that carry no data at all are doorbells (`node.wiring.doorbells`: a named pipe in the
run directory per waiting process, polled as a raw fd in the waiter's `zmq.Poller`), declared
here too; `open_bell` holds every role to this table:

| doorbell | file | waiter | ringers | rung when |
|---|---|---|---|---|
| appended | appended-SLOT.bell | the dispatcher of peer SLOT | handler | entries were appended (once per burst) |
| ack | ack.bell | ack checker | dispatchers; handler (1-member group only) | a follower's match index moved; (1 member) the leader's own end |
| commit | commit.bell | handler | ack checker | the quorum index moved |
| apply | apply.bell | applier | handler | the committed index moved (a node with a state machine) |
| local | local.bell | handler | local clients (other processes of the machine) | a local client put a request in its link, or created or closed a link (`ipc.local_link`) |
| confirm | confirm.bell | elector | handler | a linearizable read is parked: start a quorum heartbeat round (CONFIRM_LEADERSHIP) |
| confirmed | confirmed.bell | handler | elector | a round that started after the last `confirm` ring reached a quorum (LEADERSHIP_CONFIRMED); its start is in the block |

They replaced four ZeroMQ hint channels (appended PUB/SUB, ack, commit and apply PUSH/PULL):
each ZeroMQ send paid two I/O-thread hand-offs for a message that only said "look again"
(docs/performance.md "Doorbells").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import NamedTuple

import zmq

from ipc import sockets
from ipc.codes import Role
from ipc.sockets import ipc_path
from node.wiring.doorbells import Doorbell, bell_path


@dataclass(frozen=True, slots=True)
class Channel:
    """One in-node channel: `name` is its ipc:// socket file under the run directory.

    `binder` binds a `bind_type` socket; each role in `connectors` connects a `connect_type`
    socket (`open_channel` holds every role to this). `conflate`: the connectors keep only the
    newest message (a "latest value" hint, never something that must be counted)."""

    name: str
    binder: str
    bind_type: str
    connect_type: str
    connectors: tuple[str, ...] = ()
    conflate: bool = False


ROLE = Channel("elector.pub", "elector", "PUB", "SUB",
               ("handler", "dispatcher", "ack_checker", "listener"))
CONTROL = Channel("elector.ctl", "elector", "ROUTER", "DEALER", ("handler",))
RESULTS = Channel("results.pull", "handler", "PULL", "PUSH", ("applier",))
QUERY = Channel("query.router", "applier", "ROUTER", "DEALER", ("handler",))
ALL = (ROLE, CONTROL, RESULTS, QUERY)


@dataclass(frozen=True, slots=True)
class Bell:
    """One in-node doorbell (`node.wiring.doorbells`): `waiter` polls it, `ringers` ring it.
    `per_peer`: one doorbell per other member's slot (each dispatcher drains its own)."""

    name: str
    waiter: str
    ringers: tuple[str, ...]
    per_peer: bool = False

    def file_name(self, slot: int | None = None) -> str:
        if self.per_peer:
            if slot is None or slot < 0:
                raise ValueError(f"doorbell {self.name!r} is one per peer: give the peer's slot")
            return f"{self.name}-{slot}.bell"
        return f"{self.name}.bell"


APPENDED_BELL = Bell("appended", "dispatcher", ("handler",), per_peer=True)
ACK_BELL = Bell("ack", "ack_checker", ("dispatcher", "handler"))
COMMIT_BELL = Bell("commit", "handler", ("ack_checker",))
APPLY_BELL = Bell("apply", "applier", ("handler",))
CONFIRM_BELL = Bell("confirm", "elector", ("handler",))
CONFIRMED_BELL = Bell("confirmed", "handler", ("elector",))
LOCAL_BELL = Bell("local", "handler", ("local_client",))  # ipc.local_link.REQUEST_BELL (a test holds them equal)
BELLS = (APPENDED_BELL, ACK_BELL, COMMIT_BELL, APPLY_BELL, LOCAL_BELL, CONFIRM_BELL, CONFIRMED_BELL)
BELL_TOKEN = "doorbell"
"""The elector's name for the handler's `confirm` rings among its confirmation waiters (a str:
never equal to a control socket's routing identity, which is bytes)."""


@dataclass(frozen=True, slots=True)
class Port:
    """One network-facing endpoint (tcp), per member: `address` names the `ipc.sockets` helper
    that builds it from the member's host and data port.

    `binder` binds a `bind_type` socket on its own member's port; each role in `connectors`
    opens `connect_type` sockets to other members' ports. These sockets are opened in the role
    modules (their options differ per use); tests/unit/test_channels.py holds every module that
    opens one to this declaration."""

    name: str
    address: str
    binder: str
    bind_type: str
    connect_type: str
    connectors: tuple[str, ...]


DATA_PORT = Port("data port", "data_address", "handler", "ROUTER", "DEALER",
                 # dispatchers push; a follower's handler asks the leader for read indexes; the
                 # elector asks the members' terms after a lost term/vote file (group_term)
                 ("dispatcher", "handler", "elector"))
ELECTOR_PORT = Port("elector port", "elector_address", "elector", "ROUTER", "DEALER", ("elector",))
PORTS = (DATA_PORT, ELECTOR_PORT)


def endpoint(run_dir: str | Path, channel: Channel) -> str:
    """The ipc:// address of `channel` for the node whose run directory is `run_dir`."""
    return ipc_path(run_dir, channel.name)


def role_kind(role: str) -> str:
    """The name a channel declaration uses for a role: "dispatcher[2]" is a "dispatcher"."""
    return role.split("[", 1)[0]


def open_channel(ctx: zmq.Context, run_dir: str | Path, channel: Channel, role: str) -> zmq.Socket:
    """Open `role`'s end of `channel` as declared: the binder binds a `bind_type` socket, a
    connector connects a `connect_type` one, with the `ipc.sockets` options of that type.

    Why one function: the table above is then what the roles do, not a comment beside it; a
    role that is neither the binder nor a declared connector is a wiring mistake, refused with
    ValueError before any socket exists."""
    kind = role_kind(role)
    addr = endpoint(run_dir, channel)
    if kind == channel.binder:
        return _BIND[channel.bind_type](ctx, addr)
    if kind in channel.connectors:
        if channel.connect_type == "SUB":
            return sockets.sub(ctx, addr, conflate=channel.conflate)
        return _CONNECT[channel.connect_type](ctx, addr)
    raise ValueError(f"role {role!r} has no end of channel {channel.name!r} "
                     f"(binder {channel.binder}, connectors {', '.join(channel.connectors)})")


def open_bell(run_dir: str | Path, bell: Bell, role: str, slot: int | None = None) -> Doorbell:
    """Open `role`'s end of doorbell `bell` (the one of peer `slot` for a per-peer bell). As
    `open_channel`: a role that neither waits on nor rings it is a wiring mistake, refused with
    ValueError before anything is created."""
    kind = role_kind(role)
    if kind != bell.waiter and kind not in bell.ringers:
        raise ValueError(f"role {role!r} has no end of doorbell {bell.name!r} "
                         f"(waiter {bell.waiter}, ringers {', '.join(bell.ringers)})")
    return Doorbell.open(bell_path(run_dir, bell.file_name(slot)))


_BIND = {"PUB": sockets.pub, "PULL": sockets.pull, "ROUTER": sockets.router}
_CONNECT = {"PUSH": sockets.push, "DEALER": sockets.dealer}


# ---- role ------------------------------------------------------------------------------------
ROLE_TOPIC = b"role"
ROLE_MSG = struct.Struct(">4sBqqq")  # topic, role, term, leader slot, role epoch


def encode_role_msg(role: Role, term: int, leader_slot: int, epoch: int) -> bytes:
    return ROLE_MSG.pack(ROLE_TOPIC, int(role), term, leader_slot, epoch)


def decode_role_msg(frame: bytes) -> tuple[Role, int, int, int] | None:
    """(role, term, leader slot, role epoch), or None for anything that is not a role message."""
    if len(frame) != ROLE_MSG.size:
        return None
    _t, role, term, leader, epoch = ROLE_MSG.unpack(frame)
    try:
        return Role(role), term, leader, epoch
    except ValueError:
        return None


# ---- control ---------------------------------------------------------------------------------
CONFIRM_LEADERSHIP = b"confirm"
"""Handler → elector: start a heartbeat round now (a linearizable read waits for a quorum round
that began after it arrived; the elector publishes that round's start time in the block)."""
LEADERSHIP_CONFIRMED = b"confirmed"
"""Elector → handler, on the control channel: a quorum heartbeat round that started after a
CONFIRM_LEADERSHIP arrived has landed (its start is already in the block). A wake-up only: the
handler serves parked reads by what the block says (docs/contracts.md C4); a lost one costs the
handler's READ_POLL_MS fallback poll.

Both travel as doorbells (`CONFIRM_BELL`, `CONFIRMED_BELL`) between the roles of a running node:
they carry nothing, and on the commit-free path of a linearizable get they were two of its six
ZeroMQ messages. The frames remain the names the roles' code and the simulator use."""

# ---- results / query (a node with a state machine) -------------------------------------------
_RESULTS_HEAD = struct.Struct(">qI")  # first index, count
_RESULT_LEN = struct.Struct(">i")  # -1: None (a NOOP, or apply returned None)


def encode_results(first_index: int, results: list[bytes | None]) -> bytes:
    """What the state machine returned for indexes first_index .. first_index + len - 1."""
    parts = [_RESULTS_HEAD.pack(first_index, len(results))]
    for r in results:
        if r is None:
            parts.append(_RESULT_LEN.pack(-1))
        else:
            parts.append(_RESULT_LEN.pack(len(r)))
            parts.append(r)
    return b"".join(parts)


def decode_results(frame: bytes) -> tuple[int, list[bytes | None]] | None:
    """(first index, results), or None for a frame that is not a results message."""
    try:
        first, n = _RESULTS_HEAD.unpack_from(frame, 0)
        off, out = _RESULTS_HEAD.size, []
        for _ in range(n):
            (k,) = _RESULT_LEN.unpack_from(frame, off)
            off += _RESULT_LEN.size
            if k < 0:
                out.append(None)
            else:
                if off + k > len(frame):
                    return None
                out.append(bytes(frame[off:off + k]))
                off += k
    except struct.error:
        return None
    return (first, out) if off == len(frame) else None


class QueryKind(IntEnum):
    """The first byte of every frame the handler sends the applier on the query channel: what
    the frame asks for. One explicit tag per kind, decoded in `decode_query` only, so no read
    index value doubles as a message type."""

    READ = 1
    """A read of the state machine at `read_index`: answered once the applier applied it."""
    SNAPSHOT = 2
    """Take a snapshot now (`dledger snapshot`); no read index. The reply's answer is
    `SNAPSHOT_POSITION` (last index, last term) of the snapshot on disk."""
    INSTALL = 3
    """A chunk of a leader's snapshot for the applier to install (docs/snapshots.md "Install,
    end to end"); no read index. The request is `encode_install_chunk`; the reply's answer is
    `INSTALL_PROGRESS`: (received, installed, last index, last term); status QUERY_REFUSED means
    the chunk was not the next one (received says where to continue)."""


class Query(NamedTuple):
    """A decoded query frame (`decode_query`). `kind` comes last so that readers of the
    (tag, read index, request) positions, such as the simulator's trace, keep working."""

    tag: int
    read_index: int  # 0 for SNAPSHOT and INSTALL
    request: bytes
    kind: QueryKind = QueryKind.READ


_QUERY = struct.Struct(">BQq")  # kind, tag, read index
_QUERY_REPLY = struct.Struct(">QBq")  # tag, status, applied index the answer reflects
SNAPSHOT_POSITION = struct.Struct(">qq")
INSTALL_PROGRESS = struct.Struct(">qBqq")
_INSTALL_CHUNK = struct.Struct(">IQ")  # meta length, offset


def encode_install_chunk(meta: bytes, offset: int, data: bytes) -> bytes:
    return b"".join((_INSTALL_CHUNK.pack(len(meta), offset), meta, data))


def decode_install_chunk(request: bytes | memoryview) -> tuple[bytes, int, memoryview] | None:
    """(meta json, offset, data) or None for a malformed request."""
    mv = memoryview(request)
    if len(mv) < _INSTALL_CHUNK.size:
        return None
    n, offset = _INSTALL_CHUNK.unpack_from(mv)
    if _INSTALL_CHUNK.size + n > len(mv):
        return None
    start = _INSTALL_CHUNK.size
    return bytes(mv[start:start + n]), offset, mv[start + n:]


QUERY_OK = 0
QUERY_UNSUPPORTED = 1  # the state machine serves no queries
QUERY_FAILED = 2  # query() raised: the answer is the one-line reason
QUERY_REFUSED = 3  # an install chunk that is not the next one (INSTALL_PROGRESS says where)


def encode_query(tag: int, read_index: int, request: bytes, kind: QueryKind = QueryKind.READ) -> bytes:
    return _QUERY.pack(kind, tag, read_index) + request


def decode_query(frame: bytes) -> Query | None:
    """The query in `frame`, or None for a frame too short or of an unknown kind."""
    if len(frame) < _QUERY.size:
        return None
    kind, tag, read_index = _QUERY.unpack_from(frame, 0)
    try:
        return Query(tag, read_index, bytes(frame[_QUERY.size:]), QueryKind(kind))
    except ValueError:
        return None


def encode_query_reply(tag: int, status: int, applied_index: int, answer: bytes) -> bytes:
    return _QUERY_REPLY.pack(tag, status, applied_index) + answer


def decode_query_reply(frame: bytes) -> tuple[int, int, int, bytes] | None:
    if len(frame) < _QUERY_REPLY.size:
        return None
    tag, status, applied = _QUERY_REPLY.unpack_from(frame, 0)
    return tag, status, applied, bytes(frame[_QUERY_REPLY.size:])
