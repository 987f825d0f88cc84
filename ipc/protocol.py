"""The one wire codec: every message between clients, nodes and node roles. Never pickle.

Why a hand-written binary codec: frames come from the network and are untrusted (docs/contracts.md
C23), so decoding must be total (a message or ``ProtocolError``, nothing else), cheap on the hot
path (APPEND / BATCH_APPEND / PUSH are a ``struct`` pack plus a join) and versioned.

Frame layout (big-endian). Every message is exactly ONE ZeroMQ frame; a batch travels as one
frame because per-frame costs dominate small messages::

    >BBHQ   version (=1), message type, flags (FLAG_*, see the end of this module; 0 for
            most messages; a node ignores flags it does not know), request id (u64)
    ...     type-specific fields

The request id is echoed in the reply so a DEALER can pipeline many requests and match
answers. Strings (group, node ids) are u8-length-prefixed UTF-8, at most 64 bytes (addresses
and error reasons: 255). Bodies and blobs are u32-length-prefixed.

=====================  =====================================================================
type                   fields after the prefix
=====================  =====================================================================
APPEND (1)             group, remote_id, u32 n, body, [u32 session, u32 seq]
BATCH_APPEND (2)       group, remote_id, u32 count, count x u32 lengths, bodies concatenated,
                       [u32 session, u32 first seq]   (the optional session stamp of an append:
                       present iff 8 bytes follow; node/core/sessions.py)
GET (3)                group, remote_id, i64 index, u32 count, u8 linearizable
METADATA (4)           group, remote_id, [u8 want_status] (optional: 1 asks for the status
                       trailer of the response, 2 for it and the configuration after it, 3
                       for both and the ledger end term after them; absent in a plain request)
LEADERSHIP_TRANSFER(5) group, remote_id, transferee_id, i64 term
PUSH (6)               group, remote_id, leader_id, i64 term, u8 kind, i64 commit_index,
                       i64 first_index, u32 count, i64 pre_log_index, i64 pre_log_term,
                       u32 n, entries blob (raw store-format entries, node/store/codec.py),
                       u32 m, index records (0 or count x 32 bytes: the leader's own records),
                       [u32 run_crc] (optional: present iff 4 bytes follow the records; see
                       `PushRequest.run_crc`)
VOTE (7)               group, remote_id, leader_id (= candidate), i64 term,
                       i64 ledger_end_term, i64 ledger_end_index
HEARTBEAT (8)          group, remote_id, leader_id, i64 term
TAKE_LEADERSHIP (9)    group, remote_id, leader_id (= current leader), i64 term
MULTI (10) / (0x8A)    u32 count, count x (u32 n, one complete inner frame): several requests
                       (10) or responses (0x8A) in one frame; request id 0; never nested
OPEN_SESSION (11)      group, remote_id: ask the leader for a client session id
QUERY (12)             group, remote_id, u32 n, request: a read of the group's state machine
                       (docs/statemachine.md), answered at a read index (linearizable)
SNAPSHOT (13)          group, remote_id: the node takes a snapshot of its state machine now
READ_INDEX (14)        group, remote_id: a follower asks the leader for a read index
FETCH (15)             group, remote_id, i64 index, u32 max_entries, u32 max_bytes, u32 wait_ms:
                       committed entries from `index`, from any member that has them committed;
                       the member holds the request up to wait_ms for the first one (long poll)
MEMBER_CHANGE (16)     group, remote_id, u8 kind (1 add a learner, 2 promote, 3 remove), member
                       id, host (<=255), u16 port, public key (Z85, "" without --keys-dir):
                       a membership change, to the leader (docs/membership.md); answered
                       like an APPEND once its configuration entry commits (its index), or
                       with an ERROR (the refusal code and one line)
INSTALL (20)           group, remote_id, leader_id, i64 term, u32 n, meta (the snapshot's
                       meta.json), i64 offset, u32 m, chunk: one chunk of the leader's
                       snapshot for a follower that needs entries the leader no longer has
                       (docs/snapshots.md "Install"); m = 0 at offset 0 asks where to resume
responses (0x81..)     i32 code, i64 term, group, leader_id ("" = none), then:
  APPEND (0x81)          i64 index, i64 pos             (the entry's term is ``term``),
                         [i32 n, result]  (a group with a state machine: what apply returned;
                         n = -1 for None; present iff bytes follow)
  BATCH_APPEND (0x82)    i64 first_index, u32 count, count x i64 positions,
                         [count x (i32 n, result)]  (likewise, one per entry)
  GET (0x83)             u32 n, entries blob (store format)
  METADATA (0x84)        self_id, u8 role, i64 begin, i64 end, i64 committed,
                         u8 peer count, per peer: id, address (<=255), i64 match_index,
                         [status trailer, only when asked: version, i64 store_bytes,
                         f64 disk_usage_ratio, i64 leader_change_age_ms, i64 applied_index,
                         i64 end_pos, u8 n, n x i64 append-latency bucket counts,
                         [configuration: i64 index, u8 k, k x voter id, u8 l, l x learner id,
                         [i64 ledger_end_term]]]
  TRANSFER (0x85)        -
  PUSH (0x86)            i64 index, i64 begin_index, i64 end_index, i64 x_term, i64 x_index
  VOTE (0x87)            u8 vote_result, i64 ledger_end_term, i64 ledger_end_index
  HEARTBEAT (0x88)       -
  TAKE_LEADERSHIP(0x89)  -
  OPEN_SESSION (0x8B)    u32 session
  QUERY (0x8C)           i64 applied_index (the state the answer reflects), u32 n, answer
  SNAPSHOT (0x8D)        i64 last_index, i64 last_term (the snapshot now on disk)
  FETCH (0x8F)           i64 begin (the answering member's ledger begin), i64 committed (its
                         committed index), u32 n, entries blob (store format; committed only)
  READ_INDEX (0x8E)      i64 read_index (the leader's committed index, leadership confirmed
                         after the request arrived)
  INSTALL (0x94)         i64 received (bytes in place: where the next chunk must start),
                         u8 installed (1: the snapshot is installed and the log reset to it)
  ERROR (0xFF)           u8 request_type, reason (<=255 bytes)
=====================  =====================================================================

Decoded bodies and blobs are zero-copy ``memoryview`` slices of the frame: keep the frame
alive while you use them, or ``bytes()`` them. They compare equal to ``bytes``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

from ipc.codes import MsgType, Role, VoteResult  # MsgType: re-exported (its home is ipc/codes.py)
from ipc.peers import MAX_STR  # noqa: F401 - longest group / node id, in UTF-8 bytes (re-exported)

VERSION = 1
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
"""Largest frame `decode` accepts by default (also a sane ZMQ_MAXMSGSIZE)."""
DEFAULT_MAX_BODY = 4 * 1024 * 1024
"""Largest single client body by default (RocketMQ's default max message size)."""

MAX_LONG_STR = 255
"""Longest address / error reason, in UTF-8 bytes."""
MAX_BATCH_COUNT = 100_000
"""More bodies than this in one BATCH_APPEND is treated as malformed."""
MAX_MULTI_COUNT = 4096
"""More inner frames than this in one MULTI is treated as malformed."""

HEADER = struct.Struct(">BBHQ")
HEADER_SIZE = HEADER.size  # 12
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_GET = struct.Struct(">qIB")
_FETCH = struct.Struct(">qIII")
_FETCH_RESP = struct.Struct(">qq")
_TERM = struct.Struct(">q")
_PUSH = struct.Struct(">qBqqIqqI")
_VOTE = struct.Struct(">qqq")
_RESP = struct.Struct(">iq")
_APPEND_RESP = struct.Struct(">qq")
_STAMP = struct.Struct(">II")  # an append's optional (session, seq) trailer
_BATCH_RESP = struct.Struct(">qI")
_META = struct.Struct(">Bqqq")
_STATUS = struct.Struct(">qdqqq")  # NodeStatus: store bytes, disk ratio, leader age, applied, end pos
_PUSH_RESP = struct.Struct(">qqqqq")
_VOTE_RESP = struct.Struct(">Bqq")
_ENTRY_HEADER_SIZE = 48  # node/store/codec.py HEADER_SIZE; a PUSH count above blob/48 is absurd
_INDEX_RECORD_SIZE = 32  # node/store/codec.py INDEX_SIZE


class ProtocolError(ValueError):
    """A frame (or a message to encode) that is not well-formed. The only error decode raises."""


class PushKind(IntEnum):
    """DLedger's PushEntryRequest.Type (docs/replication.md "Dispatcher")."""

    APPEND = 0
    COMMIT = 1
    COMPARE = 2
    TRUNCATE = 3


Buffer = bytes | bytearray | memoryview

# ---------------------------------------------------------------------------------------------
# Messages. `request_id` is last with a default so call sites read naturally.
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class AppendRequest:
    TYPE: ClassVar[MsgType] = MsgType.APPEND
    group: str
    remote_id: str
    body: Buffer
    request_id: int = 0
    session: int = 0  # a client session's stamp (node/core/sessions.py); 0: none
    seq: int = 0
    no_result: bool = False  # header flag FLAG_NO_RESULT: answer at commit, without the result


@dataclass(slots=True)
class BatchAppendRequest:
    TYPE: ClassVar[MsgType] = MsgType.BATCH_APPEND
    group: str
    remote_id: str
    bodies: Sequence[Buffer]
    request_id: int = 0
    session: int = 0  # body k gets seq first_seq + k (mod 2**32)
    first_seq: int = 0


@dataclass(slots=True)
class GetRequest:
    TYPE: ClassVar[MsgType] = MsgType.GET
    group: str
    remote_id: str
    index: int
    count: int = 1
    linearizable: bool = False
    request_id: int = 0


@dataclass(slots=True)
class OpenSessionRequest:
    """Ask the leader for a client session id (node/core/sessions.py)."""

    TYPE: ClassVar[MsgType] = MsgType.OPEN_SESSION
    group: str
    remote_id: str
    request_id: int = 0


@dataclass(slots=True)
class OpenSessionResponse:
    TYPE: ClassVar[MsgType] = MsgType.OPEN_SESSION_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    session: int = 0
    request_id: int = 0


@dataclass(slots=True)
class QueryRequest:
    """A read-only request to the group's state machine (its `query`), served by the leader
    once it has confirmed its leadership and applied everything committed when it arrived."""

    TYPE: ClassVar[MsgType] = MsgType.QUERY
    group: str
    remote_id: str
    request: Buffer
    request_id: int = 0
    any_member: bool = False  # header flag FLAG_ANY_MEMBER: a follower may answer (read index)


@dataclass(slots=True)
class QueryResponse:
    TYPE: ClassVar[MsgType] = MsgType.QUERY_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    applied_index: int = -1
    answer: Buffer = b""
    request_id: int = 0


@dataclass(slots=True)
class SnapshotRequest:
    """Ask one node (any role) to snapshot its state machine now (`dledger snapshot`)."""

    TYPE: ClassVar[MsgType] = MsgType.SNAPSHOT
    group: str
    remote_id: str
    request_id: int = 0


@dataclass(slots=True)
class SnapshotResponse:
    TYPE: ClassVar[MsgType] = MsgType.SNAPSHOT_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    last_index: int = -1
    last_term: int = -1
    request_id: int = 0


@dataclass(slots=True)
class InstallRequest:
    """Leader's dispatcher -> follower's handler: one chunk of the leader's newest snapshot
    (docs/snapshots.md "Install, end to end"). `meta` is the snapshot's meta.json
    (node.statemachine.snapshot_meta), sent with every chunk so a receiver that restarted knows what
    it is receiving; `offset` is where `data` goes. A zero-length chunk at offset 0 is the probe
    that asks where to resume."""

    TYPE: ClassVar[MsgType] = MsgType.INSTALL
    group: str
    remote_id: str
    leader_id: str
    term: int
    meta: Buffer
    offset: int
    data: Buffer = b""
    request_id: int = 0


@dataclass(slots=True)
class InstallResponse:
    """`received`: the bytes in place, where the next chunk must start (also when a chunk was
    refused: not the next one); `installed`: the snapshot is installed and the log reset to it."""

    TYPE: ClassVar[MsgType] = MsgType.INSTALL_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    received: int = 0
    installed: bool = False
    request_id: int = 0


@dataclass(slots=True)
class MetadataRequest:
    TYPE: ClassVar[MsgType] = MsgType.METADATA
    group: str
    remote_id: str
    request_id: int = 0
    # Ask for the NodeStatus trailer (`dledger top`, `health`, `metadata`): sent as one trailing
    # u8 only when True, so a plain request is byte-for-byte what older nodes decode.
    want_status: bool = False
    # ... and the newest configuration in the node's log after it (`dledger member list`): the
    # same byte, 2. Only a tool that knows the extension asks for it, so an older decoder,
    # which ends the answer after the status, never meets it.
    want_config: bool = False
    # ... and, after the configuration, the term of the node's last entry (the byte is 3): what a
    # node that lost its term/vote state needs of each member's log (node/core/lost_state.py).
    # A node of an older version answers as for 2; the asker then knows only the member's term.
    want_end_term: bool = False


@dataclass(slots=True)
class LeadershipTransferRequest:
    TYPE: ClassVar[MsgType] = MsgType.LEADERSHIP_TRANSFER
    group: str
    remote_id: str
    transferee_id: str
    term: int = -1
    request_id: int = 0


@dataclass(slots=True)
class MemberChangeRequest:
    """A membership change (`node.core.membership.ChangeKind` as `kind`): admin right, to
    the leader, answered with an AppendResponse (the entry's index) once it commits."""

    TYPE: ClassVar[MsgType] = MsgType.MEMBER_CHANGE
    group: str
    remote_id: str
    kind: int
    member_id: str
    host: str = ""
    port: int = 0
    public_key: str = ""
    request_id: int = 0


@dataclass(slots=True)
class PushRequest:
    """Leader's dispatcher -> follower's handler. `remote_id` is the follower."""

    TYPE: ClassVar[MsgType] = MsgType.PUSH
    group: str
    remote_id: str
    leader_id: str
    term: int
    kind: PushKind
    commit_index: int = -1
    first_index: int = -1
    count: int = 0
    entries: Buffer = b""
    pre_log_index: int = -1
    pre_log_term: int = -1
    index_records: Buffer = b""  # APPEND: the leader's 32-byte index records of `entries`
    request_id: int = 0
    run_crc: int = -1
    """APPEND: the run CRC, ``node.store.codec.push_run_crc(index_records, entries)`` (CRC-32
    of the index records followed by the entries, unsigned 32 bits); -1 = absent. It lets the
    follower check every byte of the run with one CRC instead of one body CRC per entry. An
    optional trailer on the wire (after the index records), so frames without it still decode
    (-1). Last field, after `request_id`, so positional construction is unchanged."""


@dataclass(slots=True)
class VoteRequest:
    TYPE: ClassVar[MsgType] = MsgType.VOTE
    group: str
    remote_id: str
    leader_id: str  # the candidate (DLedger's VoteRequest.leaderId)
    term: int
    ledger_end_term: int
    ledger_end_index: int
    request_id: int = 0


@dataclass(slots=True)
class HeartbeatRequest:
    TYPE: ClassVar[MsgType] = MsgType.HEARTBEAT
    group: str
    remote_id: str
    leader_id: str
    term: int
    request_id: int = 0


@dataclass(slots=True)
class TakeLeadershipRequest:
    """Leader -> transferee: start an election at once (leadership transfer, docs/election.md
    "Leadership transfer")."""

    TYPE: ClassVar[MsgType] = MsgType.TAKE_LEADERSHIP
    group: str
    remote_id: str
    leader_id: str
    term: int
    request_id: int = 0


@dataclass(slots=True)
class AppendResponse:
    TYPE: ClassVar[MsgType] = MsgType.APPEND_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    index: int = -1
    pos: int = -1
    request_id: int = 0
    result: Buffer | None = None  # a group with a state machine: what apply returned


@dataclass(slots=True)
class BatchAppendResponse:
    """Entries got indices first_index .. first_index + len(positions) - 1 (contiguous)."""

    TYPE: ClassVar[MsgType] = MsgType.BATCH_APPEND_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    first_index: int = -1
    positions: Sequence[int] = field(default_factory=list)
    request_id: int = 0
    results: Sequence[Buffer | None] | None = None  # with a state machine: one per entry


@dataclass(slots=True)
class GetResponse:
    """`entries` holds whole store-format entries back to back (node.store.codec.iter_entries)."""

    TYPE: ClassVar[MsgType] = MsgType.GET_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    entries: Buffer = b""
    request_id: int = 0


@dataclass(slots=True)
class PeerInfo:
    id: str
    address: str
    match_index: int = -1


@dataclass(slots=True)
class NodeStatus:
    """METADATA's optional trailer: what operators' tools show beyond Raft state (version, disk,
    activity). Counters are cumulative; tools turn them into rates from two answers."""

    version: str = ""
    store_bytes: int = -1  # on-disk bytes of the segment files
    disk_usage_ratio: float = -1.0  # how full the store's file system is, 0-1
    leader_change_age_ms: int = -1  # since this node last saw the leader change; -1: never
    applied_index: int = -1
    end_pos: int = 0  # data-file write position (bytes written to this node's store)
    append_latency: tuple[int, ...] = ()  # per-bucket counts, node/observe/histogram.py LATENCY_MS, +Inf last
    # The newest configuration in the node's log (asked with want_config; None otherwise):
    # (entry index, -1 for the --peers bootstrap; voter ids; learner ids). docs/membership.md
    configuration: tuple[int, tuple[str, ...], tuple[str, ...]] | None = None
    # The term of the node's last entry, -1 with none (asked with want_end_term, after the
    # configuration, which is then always sent; None otherwise).
    ledger_end_term: int | None = None


@dataclass(slots=True)
class MetadataResponse:
    TYPE: ClassVar[MsgType] = MsgType.METADATA_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    self_id: str = ""
    role: Role = Role.CANDIDATE
    ledger_begin_index: int = -1
    ledger_end_index: int = -1
    committed_index: int = -1
    peers: list[PeerInfo] = field(default_factory=list)
    request_id: int = 0
    status: NodeStatus | None = None  # only when the request asked (want_status)


@dataclass(slots=True)
class TransferResponse:
    TYPE: ClassVar[MsgType] = MsgType.TRANSFER_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    request_id: int = 0


@dataclass(slots=True)
class PushResponse:
    TYPE: ClassVar[MsgType] = MsgType.PUSH_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    index: int = -1
    begin_index: int = -1
    end_index: int = -1
    x_term: int = -1
    x_index: int = -1
    request_id: int = 0


@dataclass(slots=True)
class VoteResponse:
    TYPE: ClassVar[MsgType] = MsgType.VOTE_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    vote_result: VoteResult = VoteResult.UNKNOWN
    ledger_end_term: int = -1
    ledger_end_index: int = -1
    request_id: int = 0


@dataclass(slots=True)
class HeartbeatResponse:
    TYPE: ClassVar[MsgType] = MsgType.HEARTBEAT_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    request_id: int = 0


@dataclass(slots=True)
class TakeLeadershipResponse:
    TYPE: ClassVar[MsgType] = MsgType.TAKE_LEADERSHIP_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    request_id: int = 0


@dataclass(slots=True)
class ErrorResponse:
    """Answer to ANY request that could not be served as its own type (malformed, wrong group…).

    `request_type` is the type byte of the request when it could be read, else 0.
    """

    TYPE: ClassVar[MsgType] = MsgType.ERROR_RESPONSE
    code: int
    group: str = ""
    term: int = -1
    leader_id: str = ""
    reason: str = ""
    request_type: int = 0
    request_id: int = 0


@dataclass(slots=True)
class ReadIndexRequest:
    """A follower's handler asks the leader for a read index on behalf of a client's read."""

    TYPE: ClassVar[MsgType] = MsgType.READ_INDEX
    group: str
    remote_id: str
    request_id: int = 0


@dataclass(slots=True)
class ReadIndexResponse:
    """The leader's committed index once a heartbeat round that started after the request
    arrived confirmed it (or under its lease, with `read_lease`): a linearizable read point."""

    TYPE: ClassVar[MsgType] = MsgType.READ_INDEX_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    read_index: int = -1
    request_id: int = 0


@dataclass(slots=True)
class FetchRequest:
    """A long-poll read of committed entries (docs/client.md "Following the log"): any member
    answers from its own log up to the committed index it knows, holding the request up to
    `wait_ms` when it has nothing from `index` yet."""

    TYPE: ClassVar[MsgType] = MsgType.FETCH
    group: str
    remote_id: str
    index: int
    max_entries: int = 1000
    max_bytes: int = 1 << 20
    wait_ms: int = 0
    request_id: int = 0


@dataclass(slots=True)
class FetchResponse:
    """Committed entries from the requested index (possibly none), with the answering member's
    ledger begin and committed index so a reader knows where the log stands there."""

    TYPE: ClassVar[MsgType] = MsgType.FETCH_RESPONSE
    code: int
    group: str
    term: int
    leader_id: str = ""
    begin_index: int = -1
    committed_index: int = -1
    entries: Buffer = b""
    request_id: int = 0


@dataclass(slots=True)
class Multi:
    """Several complete frames in one: what a pipelining client sends when many requests are
    queued at once, and what a node answers them with.

    Why: on a 2-core machine every ZeroMQ message costs a wake-up of the sender's and the
    receiver's I/O threads; single appends pipelined 256 deep paid that per append in both
    directions. The inner frames stay undecoded (`frames`), so each is decoded — and, if
    malformed, answered — on its own. A node only answers in MULTI_RESPONSE to a peer that
    has sent it a MULTI, so clients that never send one never receive one.
    """

    frames: list[Buffer] = field(default_factory=list)
    response: bool = False
    request_id: int = 0

    @property
    def TYPE(self) -> MsgType:  # noqa: N802 - mirrors the other messages' class attribute
        return MsgType.MULTI_RESPONSE if self.response else MsgType.MULTI


Request = (AppendRequest | BatchAppendRequest | GetRequest | MetadataRequest
           | LeadershipTransferRequest | PushRequest | VoteRequest | HeartbeatRequest
           | TakeLeadershipRequest | OpenSessionRequest | QueryRequest | SnapshotRequest
           | InstallRequest | ReadIndexRequest | FetchRequest | MemberChangeRequest)
Response = (AppendResponse | BatchAppendResponse | GetResponse | MetadataResponse
            | TransferResponse | PushResponse | VoteResponse | HeartbeatResponse
            | TakeLeadershipResponse | OpenSessionResponse | QueryResponse | SnapshotResponse
            | InstallResponse | ReadIndexResponse | FetchResponse | ErrorResponse)
Message = Request | Response | Multi

# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def _s(s: str, limit: int = MAX_STR) -> bytes:
    """u8-length-prefixed UTF-8."""
    b = s.encode("utf-8")
    n = len(b)
    if n > limit:
        raise ProtocolError(f"string of {n} bytes exceeds {limit}: {s[:20]!r}...")
    return _U8.pack(n) + b


def _hdr(msg: Message) -> bytes:
    return HEADER.pack(VERSION, msg.TYPE, 0, msg.request_id)


@functools.lru_cache(maxsize=256)
def _route(group: str, remote_id: str) -> bytes:
    return _s(group) + _s(remote_id)


def _enc_append(m: AppendRequest) -> bytes:
    return encode_append(m.group, m.remote_id, m.body, m.request_id, m.session, m.seq, m.no_result)


def encode_append(group: str, remote_id: str, body: Buffer, request_id: int, session: int = 0,
                  seq: int = 0, no_result: bool = False) -> bytes:
    """``encode(AppendRequest(group, remote_id, body, request_id, session, seq, no_result))``
    without building the message object: a pipelining client's per-append cost (same bytes,
    tested)."""
    flags = FLAG_NO_RESULT if no_result else 0
    try:
        return b"".join((HEADER.pack(VERSION, MsgType.APPEND, flags, request_id), _route(group, remote_id),
                         _U32.pack(len(body)), body, _stamp(session, seq)))
    except struct.error as e:
        raise ProtocolError(f"cannot encode AppendRequest: {e}") from None


def _stamp(session: int, seq: int) -> bytes:
    """The optional session trailer: absent without a session (older frames unchanged)."""
    return _STAMP.pack(session, seq) if session else b""


def _enc_open_session(m: OpenSessionRequest) -> bytes:
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id)))


def _enc_open_session_resp(m: OpenSessionResponse) -> bytes:
    return _resp(m) + _U32.pack(m.session)


def _enc_batch(m: BatchAppendRequest) -> bytes:
    bodies = m.bodies
    n = len(bodies)
    if n > MAX_BATCH_COUNT:
        raise ProtocolError(f"batch of {n} bodies exceeds {MAX_BATCH_COUNT}")
    lengths = struct.pack(f">I{n}I", n, *map(len, bodies))
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id), lengths, *bodies,
                     _stamp(m.session, m.first_seq)))


def _enc_get(m: GetRequest) -> bytes:
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id),
                     _GET.pack(m.index, m.count, 1 if m.linearizable else 0)))


def _enc_metadata(m: MetadataRequest) -> bytes:
    # getattr: SNAPSHOT requests share this layout and have neither field
    want = (b"\x03" if getattr(m, "want_end_term", False) else
            b"\x02" if getattr(m, "want_config", False) else
            b"\x01" if getattr(m, "want_status", False) else b"")
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id), want))


def _enc_transfer(m: LeadershipTransferRequest) -> bytes:
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id), _s(m.transferee_id),
                     _TERM.pack(m.term)))


_CHANGE_KINDS = (1, 2, 3)  # node.core.membership.ChangeKind (the codec imports no node code)


def _enc_member_change(m: MemberChangeRequest) -> bytes:
    if m.kind not in _CHANGE_KINDS:
        raise ProtocolError(f"membership change kind {m.kind}: expected 1 (add), 2 (promote) or 3 (remove)")
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id), _U8.pack(m.kind), _s(m.member_id),
                     _s(m.host, MAX_LONG_STR), struct.pack(">H", m.port), _s(m.public_key)))


def _enc_push(m: PushRequest) -> bytes:
    blob = m.entries
    if not -1 <= m.run_crc <= 0xFFFFFFFF:
        raise ProtocolError(f"run_crc {m.run_crc} is neither -1 (absent) nor an unsigned 32-bit CRC")
    trailer = _U32.pack(m.run_crc) if m.run_crc >= 0 else b""
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id), _s(m.leader_id),
                     _PUSH.pack(m.term, m.kind, m.commit_index, m.first_index, m.count,
                                m.pre_log_index, m.pre_log_term, len(blob)), blob,
                     _U32.pack(len(m.index_records)), m.index_records, trailer))


_INSTALL_RESP = struct.Struct(">qB")
MAX_INSTALL_META = 4096  # a meta.json is ~200 bytes; more is not a meta


def _enc_install(m: InstallRequest) -> bytes:
    if len(m.meta) > MAX_INSTALL_META:
        raise ProtocolError(f"install meta of {len(m.meta)} bytes exceeds {MAX_INSTALL_META}")
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id), _s(m.leader_id), _TERM.pack(m.term),
                     _U32.pack(len(m.meta)), m.meta, _TERM.pack(m.offset), _U32.pack(len(m.data)),
                     m.data))


def _enc_install_resp(m: InstallResponse) -> bytes:
    return _resp(m) + _INSTALL_RESP.pack(m.received, 1 if m.installed else 0)


def _enc_vote(m: VoteRequest) -> bytes:
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id), _s(m.leader_id),
                     _VOTE.pack(m.term, m.ledger_end_term, m.ledger_end_index)))


def _enc_leader_term(m: HeartbeatRequest | TakeLeadershipRequest) -> bytes:
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id), _s(m.leader_id), _TERM.pack(m.term)))


def _resp(m: Response) -> bytes:
    return b"".join((_hdr(m), _RESP.pack(m.code, m.term), _s(m.group), _s(m.leader_id)))


_RESULT_LEN = struct.Struct(">i")


def _enc_result(r: Buffer | None) -> bytes:
    return _RESULT_LEN.pack(-1) if r is None else _RESULT_LEN.pack(len(r)) + bytes(r)


def _enc_append_resp(m: AppendResponse) -> bytes:
    head = _resp(m) + _APPEND_RESP.pack(m.index, m.pos)
    return head if m.result is None else head + _enc_result(m.result)


def _enc_batch_resp(m: BatchAppendResponse) -> bytes:
    n = len(m.positions)
    out = _resp(m) + _BATCH_RESP.pack(m.first_index, n) + struct.pack(f">{n}q", *m.positions)
    if m.results is None:
        return out
    if len(m.results) != n:
        raise ProtocolError(f"{len(m.results)} results for {n} entries")
    return out + b"".join(_enc_result(r) for r in m.results)


def _enc_query(m: QueryRequest) -> bytes:
    head = HEADER.pack(VERSION, m.TYPE, FLAG_ANY_MEMBER if m.any_member else 0, m.request_id)
    return b"".join((head, _s(m.group), _s(m.remote_id), _U32.pack(len(m.request)), m.request))


def _enc_snapshot_resp(m: SnapshotResponse) -> bytes:
    return _resp(m) + _TERM.pack(m.last_index) + _TERM.pack(m.last_term)


def _enc_query_resp(m: QueryResponse) -> bytes:
    return b"".join((_resp(m), _TERM.pack(m.applied_index), _U32.pack(len(m.answer)), m.answer))


def _enc_get_resp(m: GetResponse) -> bytes:
    return b"".join((_resp(m), _U32.pack(len(m.entries)), m.entries))


def _enc_meta_resp(m: MetadataResponse) -> bytes:
    if len(m.peers) > 255:
        raise ProtocolError(f"{len(m.peers)} peers exceed 255")
    parts = [_resp(m), _s(m.self_id), _META.pack(m.role, m.ledger_begin_index,
                                                 m.ledger_end_index, m.committed_index),
             _U8.pack(len(m.peers))]
    for p in m.peers:
        parts += (_s(p.id), _s(p.address, MAX_LONG_STR), _TERM.pack(p.match_index))
    if m.status is not None:
        st = m.status
        if len(st.append_latency) > 255:
            raise ProtocolError(f"{len(st.append_latency)} histogram buckets exceed 255")
        parts += (_s(st.version), _STATUS.pack(st.store_bytes, st.disk_usage_ratio,
                                               st.leader_change_age_ms, st.applied_index, st.end_pos),
                  _U8.pack(len(st.append_latency)),
                  struct.pack(f">{len(st.append_latency)}q", *st.append_latency))
        if st.configuration is not None:
            index, voters, learners = st.configuration
            if len(voters) > 255 or len(learners) > 255:
                raise ProtocolError("more than 255 voters or learners")
            parts += (_TERM.pack(index), _U8.pack(len(voters)), *(_s(v) for v in voters),
                      _U8.pack(len(learners)), *(_s(x) for x in learners))
        if st.ledger_end_term is not None:
            if st.configuration is None:
                raise ProtocolError("the ledger end term follows the configuration")
            parts.append(_TERM.pack(st.ledger_end_term))
    return b"".join(parts)


def _enc_read_index(m: ReadIndexRequest) -> bytes:
    return b"".join((_hdr(m), _s(m.group), _s(m.remote_id)))


def _enc_read_index_resp(m: ReadIndexResponse) -> bytes:
    return _resp(m) + _TERM.pack(m.read_index)


def _enc_fetch(m: FetchRequest) -> bytes:
    try:
        return b"".join((_hdr(m), _s(m.group), _s(m.remote_id),
                         _FETCH.pack(m.index, m.max_entries, m.max_bytes, m.wait_ms)))
    except struct.error as e:
        raise ProtocolError(f"cannot encode FetchRequest: {e}") from None


def _enc_fetch_resp(m: FetchResponse) -> bytes:
    return b"".join((_resp(m), _FETCH_RESP.pack(m.begin_index, m.committed_index),
                     _U32.pack(len(m.entries)), m.entries))


def _enc_push_resp(m: PushResponse) -> bytes:
    return _resp(m) + _PUSH_RESP.pack(m.index, m.begin_index, m.end_index, m.x_term, m.x_index)


def _enc_vote_resp(m: VoteResponse) -> bytes:
    return _resp(m) + _VOTE_RESP.pack(m.vote_result, m.ledger_end_term, m.ledger_end_index)


def _enc_error(m: ErrorResponse) -> bytes:
    # The reason is for humans: cut it (on a character boundary) rather than fail to report.
    reason = m.reason.encode("utf-8")[:MAX_LONG_STR].decode("utf-8", "ignore")
    return _resp(m) + _U8.pack(m.request_type & 0xFF) + _s(reason, MAX_LONG_STR)


def _enc_multi(m: Multi) -> bytes:
    if not 0 < len(m.frames) <= MAX_MULTI_COUNT:
        raise ProtocolError(f"a MULTI carries 1..{MAX_MULTI_COUNT} frames, not {len(m.frames)}")
    parts = [HEADER.pack(VERSION, m.TYPE, 0, 0), _U32.pack(len(m.frames))]
    for f in m.frames:
        parts.append(_U32.pack(len(f)))
        parts.append(f)
    return b"".join(parts)


def encode_multi(frames: Sequence[Buffer], response: bool = False) -> bytes:
    """One frame carrying `frames` (already encoded), or the frame itself if there is one."""
    if len(frames) == 1:
        return bytes(frames[0])
    return _enc_multi(Multi(list(frames), response))


_ENCODERS = {
    Multi: _enc_multi,
    AppendRequest: _enc_append,
    BatchAppendRequest: _enc_batch,
    OpenSessionRequest: _enc_open_session,
    OpenSessionResponse: _enc_open_session_resp,
    QueryRequest: _enc_query,
    QueryResponse: _enc_query_resp,
    SnapshotRequest: _enc_metadata,
    SnapshotResponse: _enc_snapshot_resp,
    InstallRequest: _enc_install,
    InstallResponse: _enc_install_resp,
    ReadIndexRequest: _enc_read_index,
    ReadIndexResponse: _enc_read_index_resp,
    FetchRequest: _enc_fetch,
    FetchResponse: _enc_fetch_resp,
    GetRequest: _enc_get,
    MetadataRequest: _enc_metadata,
    LeadershipTransferRequest: _enc_transfer,
    MemberChangeRequest: _enc_member_change,
    PushRequest: _enc_push,
    VoteRequest: _enc_vote,
    HeartbeatRequest: _enc_leader_term,
    TakeLeadershipRequest: _enc_leader_term,
    AppendResponse: _enc_append_resp,
    BatchAppendResponse: _enc_batch_resp,
    GetResponse: _enc_get_resp,
    MetadataResponse: _enc_meta_resp,
    TransferResponse: _resp,
    PushResponse: _enc_push_resp,
    VoteResponse: _enc_vote_resp,
    HeartbeatResponse: _resp,
    TakeLeadershipResponse: _resp,
    ErrorResponse: _enc_error,
}


def encode(msg: Message) -> bytes:
    """Encode one message into one frame. Raises ProtocolError for unencodable values."""
    try:
        enc = _ENCODERS[type(msg)]
    except KeyError:
        raise ProtocolError(f"not a protocol message: {type(msg).__name__}") from None
    try:
        return enc(msg)
    except struct.error as e:  # a field out of its wire range (negative u32, huge int...)
        raise ProtocolError(f"cannot encode {type(msg).__name__}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Decoding. Each decoder gets (view, offset after the prefix, request id, max_body) and must
# consume the frame exactly; `struct.error` / `UnicodeDecodeError` are mapped to ProtocolError
# in `decode`, explicit checks give the clearer messages.
# ---------------------------------------------------------------------------------------------


def _str(mv: memoryview, off: int, limit: int = MAX_STR) -> tuple[str, int]:
    if off >= len(mv):
        raise ProtocolError(f"truncated frame: string length missing at offset {off}")
    n = mv[off]
    off += 1
    if n > limit:
        raise ProtocolError(f"string of {n} bytes exceeds {limit} at offset {off - 1}")
    end = off + n
    if end > len(mv):
        raise ProtocolError(f"string of {n} bytes at offset {off} runs past the frame ({len(mv)})")
    return str(mv[off:end], "utf-8"), end


def _need(mv: memoryview, off: int, n: int, what: str) -> None:
    if off + n > len(mv):
        raise ProtocolError(f"truncated frame: {what} needs {n} bytes at offset {off}, "
                            f"frame has {len(mv)}")


def _end(mv: memoryview, off: int) -> None:
    if off != len(mv):
        raise ProtocolError(f"{len(mv) - off} bytes of trailing garbage at offset {off}")


def _blob(mv: memoryview, off: int, limit: int, what: str) -> tuple[memoryview, int]:
    _need(mv, off, 4, f"{what} length")
    (n,) = _U32.unpack_from(mv, off)
    off += 4
    if n > limit:
        raise ProtocolError(f"{what} of {n} bytes exceeds the limit {limit}")
    _need(mv, off, n, what)
    return mv[off:off + n], off + n


def _dec_append(mv: memoryview, off: int, rid: int, max_body: int) -> AppendRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    body, off = _blob(mv, off, max_body, "body")
    session, seq, off = _dec_stamp(mv, off)
    _end(mv, off)
    return AppendRequest(group, remote, body, rid, session, seq)


def _dec_stamp(mv: memoryview, off: int) -> tuple[int, int, int]:
    """An append's optional (session, seq) trailer: there iff exactly 8 bytes are left."""
    if len(mv) - off == _STAMP.size:
        session, seq = _STAMP.unpack_from(mv, off)
        if session == 0:
            raise ProtocolError("a session trailer with session 0")
        return session, seq, off + _STAMP.size
    return 0, 0, off


def _dec_open_session(mv: memoryview, off: int, rid: int, max_body: int) -> OpenSessionRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    _end(mv, off)
    return OpenSessionRequest(group, remote, rid)


def _dec_open_session_resp(mv: memoryview, off: int, rid: int, max_body: int) -> OpenSessionResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, 4, "session id")
    (session,) = _U32.unpack_from(mv, off)
    _end(mv, off + 4)
    return OpenSessionResponse(code, group, term, leader, session, rid)


def _dec_batch(mv: memoryview, off: int, rid: int, max_body: int) -> BatchAppendRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    _need(mv, off, 4, "batch count")
    (n,) = _U32.unpack_from(mv, off)
    off += 4
    if n > MAX_BATCH_COUNT or 4 * n > len(mv) - off:
        raise ProtocolError(f"absurd batch count {n} for a frame of {len(mv)} bytes")
    lengths = struct.unpack_from(f">{n}I", mv, off)  # one unpack for the whole array
    off += 4 * n
    if lengths and max(lengths) > max_body:
        raise ProtocolError(f"batch body of {max(lengths)} bytes exceeds the limit {max_body}")
    total = sum(lengths)
    session = first_seq = 0
    if total + _STAMP.size == len(mv) - off:  # the optional session trailer
        session, first_seq, _ = _dec_stamp(mv, len(mv) - _STAMP.size)
    elif total != len(mv) - off:
        raise ProtocolError(f"batch lengths sum to {total} but {len(mv) - off} bytes follow")
    bodies = []
    append = bodies.append
    for ln in lengths:
        nxt = off + ln
        append(mv[off:nxt])
        off = nxt
    return BatchAppendRequest(group, remote, bodies, rid, session, first_seq)


def _dec_get(mv: memoryview, off: int, rid: int, max_body: int) -> GetRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    _need(mv, off, _GET.size, "GET fields")
    index, count, lin = _GET.unpack_from(mv, off)
    off += _GET.size
    if lin > 1:
        raise ProtocolError(f"linearizable flag must be 0 or 1, got {lin}")
    _end(mv, off)
    return GetRequest(group, remote, index, count, bool(lin), rid)


def _dec_metadata(mv: memoryview, off: int, rid: int, max_body: int) -> MetadataRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    want = 0
    if off < len(mv):  # the optional want_status byte
        want = mv[off]
        off += 1
    _end(mv, off)
    return MetadataRequest(group, remote, rid, want >= 1, want >= 2, want >= 3)


def _dec_transfer(mv: memoryview, off: int, rid: int, max_body: int) -> LeadershipTransferRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    transferee, off = _str(mv, off)
    _need(mv, off, 8, "term")
    (term,) = _TERM.unpack_from(mv, off)
    _end(mv, off + 8)
    return LeadershipTransferRequest(group, remote, transferee, term, rid)


def _dec_member_change(mv: memoryview, off: int, rid: int, max_body: int) -> MemberChangeRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    _need(mv, off, 1, "change kind")
    kind = mv[off]
    if kind not in _CHANGE_KINDS:
        raise ProtocolError(f"membership change kind {kind}: expected 1 (add), 2 (promote) or 3 (remove)")
    member, off = _str(mv, off + 1)
    host, off = _str(mv, off, MAX_LONG_STR)
    _need(mv, off, 2, "port")
    (port,) = struct.unpack_from(">H", mv, off)
    key, off = _str(mv, off + 2)
    _end(mv, off)
    return MemberChangeRequest(group, remote, kind, member, host, port, key, rid)


def _dec_push(mv: memoryview, off: int, rid: int, max_body: int) -> PushRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    leader, off = _str(mv, off)
    _need(mv, off, _PUSH.size, "PUSH fields")
    term, kind, commit, first, count, pre_i, pre_t, n = _PUSH.unpack_from(mv, off)
    off += _PUSH.size
    if kind > PushKind.TRUNCATE:
        raise ProtocolError(f"unknown push kind {kind}")
    _need(mv, off, n, "entries blob")
    if count * _ENTRY_HEADER_SIZE > n and kind == PushKind.APPEND:
        raise ProtocolError(f"absurd entry count {count} for a blob of {n} bytes")
    blob = mv[off:off + n]
    idx, off = _blob(mv, off + n, len(mv), "index records")
    if len(idx) % _INDEX_RECORD_SIZE or (len(idx) and len(idx) // _INDEX_RECORD_SIZE != count):
        raise ProtocolError(f"index records of {len(idx)} bytes do not describe {count} entries")
    run_crc = -1
    if len(mv) - off == _U32.size:  # the optional run CRC trailer
        (run_crc,) = _U32.unpack_from(mv, off)
        off += _U32.size
    _end(mv, off)
    return PushRequest(group, remote, leader, term, PushKind(kind), commit, first, count, blob,
                       pre_i, pre_t, idx, rid, run_crc)


def _dec_vote(mv: memoryview, off: int, rid: int, max_body: int) -> VoteRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    leader, off = _str(mv, off)
    _need(mv, off, _VOTE.size, "VOTE fields")
    term, let, lei = _VOTE.unpack_from(mv, off)
    _end(mv, off + _VOTE.size)
    return VoteRequest(group, remote, leader, term, let, lei, rid)


def _dec_leader_term(cls: type[HeartbeatRequest] | type[TakeLeadershipRequest]):
    def dec(mv: memoryview, off: int, rid: int, max_body: int):
        group, off = _str(mv, off)
        remote, off = _str(mv, off)
        leader, off = _str(mv, off)
        _need(mv, off, 8, "term")
        (term,) = _TERM.unpack_from(mv, off)
        _end(mv, off + 8)
        return cls(group, remote, leader, term, request_id=rid)
    return dec


def _dec_resp_common(mv: memoryview, off: int) -> tuple[int, int, str, str, int]:
    _need(mv, off, _RESP.size, "response code/term")
    code, term = _RESP.unpack_from(mv, off)
    group, off = _str(mv, off + _RESP.size)
    leader, off = _str(mv, off)
    return code, term, group, leader, off


def _dec_plain_resp(cls):
    def dec(mv: memoryview, off: int, rid: int, max_body: int):
        code, term, group, leader, off = _dec_resp_common(mv, off)
        _end(mv, off)
        return cls(code, group, term, leader, request_id=rid)
    return dec


def _dec_result(mv: memoryview, off: int, max_body: int) -> tuple[memoryview | None, int]:
    _need(mv, off, 4, "result length")
    (n,) = _RESULT_LEN.unpack_from(mv, off)
    off += 4
    if n < -1 or n > max_body:
        raise ProtocolError(f"result length {n} out of range")
    if n == -1:
        return None, off
    _need(mv, off, n, "result")
    return mv[off:off + n], off + n


def _dec_append_resp(mv: memoryview, off: int, rid: int, max_body: int) -> AppendResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, _APPEND_RESP.size, "APPEND response fields")
    index, pos = _APPEND_RESP.unpack_from(mv, off)
    off += _APPEND_RESP.size
    result = None
    if off < len(mv):
        result, off = _dec_result(mv, off, max_body)
    _end(mv, off)
    return AppendResponse(code, group, term, leader, index, pos, rid, result)


def _dec_query(mv: memoryview, off: int, rid: int, max_body: int) -> QueryRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    request, off = _blob(mv, off, max_body, "query")
    _end(mv, off)
    return QueryRequest(group, remote, request, rid)


def _dec_snapshot(mv: memoryview, off: int, rid: int, max_body: int) -> SnapshotRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    _end(mv, off)
    return SnapshotRequest(group, remote, rid)


def _dec_install(mv: memoryview, off: int, rid: int, max_body: int) -> InstallRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    leader, off = _str(mv, off)
    _need(mv, off, 8, "term")
    (term,) = _TERM.unpack_from(mv, off)
    meta, off = _blob(mv, off + 8, MAX_INSTALL_META, "install meta")
    _need(mv, off, 8, "offset")
    (offset,) = _TERM.unpack_from(mv, off)
    if offset < 0:
        raise ProtocolError(f"negative install offset {offset}")
    data, off = _blob(mv, off + 8, len(mv), "install chunk")
    _end(mv, off)
    return InstallRequest(group, remote, leader, term, meta, offset, data, rid)


def _dec_install_resp(mv: memoryview, off: int, rid: int, max_body: int) -> InstallResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, _INSTALL_RESP.size, "INSTALL response fields")
    received, installed = _INSTALL_RESP.unpack_from(mv, off)
    if installed > 1:
        raise ProtocolError(f"installed flag {installed} is not 0 or 1")
    _end(mv, off + _INSTALL_RESP.size)
    return InstallResponse(code, group, term, leader, received, bool(installed), rid)


def _dec_snapshot_resp(mv: memoryview, off: int, rid: int, max_body: int) -> SnapshotResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, 16, "snapshot position")
    (last_index,) = _TERM.unpack_from(mv, off)
    (last_term,) = _TERM.unpack_from(mv, off + 8)
    _end(mv, off + 16)
    return SnapshotResponse(code, group, term, leader, last_index, last_term, rid)


def _dec_query_resp(mv: memoryview, off: int, rid: int, max_body: int) -> QueryResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, 8, "applied index")
    (applied,) = _TERM.unpack_from(mv, off)
    answer, off = _blob(mv, off + 8, len(mv), "query answer")
    _end(mv, off)
    return QueryResponse(code, group, term, leader, applied, answer, rid)


def _dec_batch_resp(mv: memoryview, off: int, rid: int, max_body: int) -> BatchAppendResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, _BATCH_RESP.size, "BATCH_APPEND response fields")
    first, n = _BATCH_RESP.unpack_from(mv, off)
    off += _BATCH_RESP.size
    if 8 * n > len(mv) - off:
        raise ProtocolError(f"position count {n} disagrees with the {len(mv) - off} bytes left")
    positions = list(struct.unpack_from(f">{n}q", mv, off))
    off += 8 * n
    results = None
    if off < len(mv):
        results = []
        for _ in range(n):
            r, off = _dec_result(mv, off, max_body)
            results.append(r)
    _end(mv, off)
    return BatchAppendResponse(code, group, term, leader, first, positions, rid, results)


def _dec_get_resp(mv: memoryview, off: int, rid: int, max_body: int) -> GetResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    blob, off = _blob(mv, off, len(mv), "entries blob")
    _end(mv, off)
    return GetResponse(code, group, term, leader, blob, rid)


def _dec_meta_resp(mv: memoryview, off: int, rid: int, max_body: int) -> MetadataResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    self_id, off = _str(mv, off)
    _need(mv, off, _META.size + 1, "METADATA fields")
    role, begin, end, committed = _META.unpack_from(mv, off)
    off += _META.size
    if role > Role.LEADER:
        raise ProtocolError(f"unknown role {role}")
    n = mv[off]
    off += 1
    if n * 10 > len(mv) - off:  # each peer takes at least 1 + 1 + 8 bytes
        raise ProtocolError(f"absurd peer count {n} for {len(mv) - off} bytes left")
    peers = []
    for _ in range(n):
        pid, off = _str(mv, off)
        addr, off = _str(mv, off, MAX_LONG_STR)
        _need(mv, off, 8, "peer match index")
        (match,) = _TERM.unpack_from(mv, off)
        off += 8
        peers.append(PeerInfo(pid, addr, match))
    status = None
    if off < len(mv):  # the optional NodeStatus trailer
        version, off = _str(mv, off)
        _need(mv, off, _STATUS.size + 1, "METADATA status")
        store_bytes, ratio, age, applied, end_pos = _STATUS.unpack_from(mv, off)
        off += _STATUS.size
        nb = mv[off]
        off += 1
        _need(mv, off, 8 * nb, "METADATA status histogram")
        buckets = struct.unpack_from(f">{nb}q", mv, off)
        off += 8 * nb
        config = None
        if off < len(mv):  # the configuration, asked with want_config
            _need(mv, off, 9, "METADATA configuration")
            (index,) = _TERM.unpack_from(mv, off)
            off += 8
            groups: list[tuple[str, ...]] = []
            for _ in range(2):
                _need(mv, off, 1, "METADATA configuration")
                k = mv[off]
                off += 1
                ids = []
                for _ in range(k):
                    nid, off = _str(mv, off)
                    ids.append(nid)
                groups.append(tuple(ids))
            config = (index, groups[0], groups[1])
        end_term = None
        if config is not None and off < len(mv):  # the ledger end term, asked with want_end_term
            _need(mv, off, 8, "METADATA ledger end term")
            (end_term,) = _TERM.unpack_from(mv, off)
            off += 8
        status = NodeStatus(version, store_bytes, ratio, age, applied, end_pos, buckets, config, end_term)
    _end(mv, off)
    return MetadataResponse(code, group, term, leader, self_id, Role(role), begin, end,
                            committed, peers, rid, status)


def _dec_read_index(mv: memoryview, off: int, rid: int, max_body: int) -> ReadIndexRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    _end(mv, off)
    return ReadIndexRequest(group, remote, rid)


def _dec_read_index_resp(mv: memoryview, off: int, rid: int, max_body: int) -> ReadIndexResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, 8, "read index")
    (read_index,) = _TERM.unpack_from(mv, off)
    _end(mv, off + 8)
    return ReadIndexResponse(code, group, term, leader, read_index, rid)


def _dec_fetch(mv: memoryview, off: int, rid: int, max_body: int) -> FetchRequest:
    group, off = _str(mv, off)
    remote, off = _str(mv, off)
    _need(mv, off, _FETCH.size, "FETCH fields")
    index, max_entries, max_bytes, wait_ms = _FETCH.unpack_from(mv, off)
    _end(mv, off + _FETCH.size)
    return FetchRequest(group, remote, index, max_entries, max_bytes, wait_ms, rid)


def _dec_fetch_resp(mv: memoryview, off: int, rid: int, max_body: int) -> FetchResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, _FETCH_RESP.size, "FETCH response fields")
    begin, committed = _FETCH_RESP.unpack_from(mv, off)
    blob, off = _blob(mv, off + _FETCH_RESP.size, len(mv), "entries blob")
    _end(mv, off)
    return FetchResponse(code, group, term, leader, begin, committed, blob, rid)


def _dec_push_resp(mv: memoryview, off: int, rid: int, max_body: int) -> PushResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, _PUSH_RESP.size, "PUSH response fields")
    index, begin, end, x_term, x_index = _PUSH_RESP.unpack_from(mv, off)
    _end(mv, off + _PUSH_RESP.size)
    return PushResponse(code, group, term, leader, index, begin, end, x_term, x_index, rid)


def _dec_vote_resp(mv: memoryview, off: int, rid: int, max_body: int) -> VoteResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, _VOTE_RESP.size, "VOTE response fields")
    result, let, lei = _VOTE_RESP.unpack_from(mv, off)
    if result > VoteResult.REJECT_TAKING_LEADERSHIP:
        raise ProtocolError(f"unknown vote result {result}")
    _end(mv, off + _VOTE_RESP.size)
    return VoteResponse(code, group, term, leader, VoteResult(result), let, lei, rid)


def _dec_error(mv: memoryview, off: int, rid: int, max_body: int) -> ErrorResponse:
    code, term, group, leader, off = _dec_resp_common(mv, off)
    _need(mv, off, 1, "request type")
    rtype = mv[off]
    reason, off = _str(mv, off + 1, MAX_LONG_STR)
    _end(mv, off)
    return ErrorResponse(code, group, term, leader, reason, rtype, rid)


def _dec_multi(response: bool):
    def dec(mv: memoryview, off: int, rid: int, max_body: int) -> Multi:
        _need(mv, off, 4, "MULTI count")
        (n,) = _U32.unpack_from(mv, off)
        off += 4
        if not 0 < n <= MAX_MULTI_COUNT or 4 * n > len(mv) - off:
            raise ProtocolError(f"absurd MULTI count {n} for a frame of {len(mv)} bytes")
        frames = []
        for _ in range(n):
            f, off = _blob(mv, off, len(mv), "MULTI inner frame")
            if len(f) >= HEADER_SIZE and f[1] in (MsgType.MULTI, MsgType.MULTI_RESPONSE):
                raise ProtocolError("nested MULTI")
            frames.append(f)
        _end(mv, off)
        return Multi(frames, response, rid)
    return dec


_DECODERS = {
    MsgType.MULTI: _dec_multi(False),
    MsgType.MULTI_RESPONSE: _dec_multi(True),
    MsgType.APPEND: _dec_append,
    MsgType.BATCH_APPEND: _dec_batch,
    MsgType.OPEN_SESSION: _dec_open_session,
    MsgType.OPEN_SESSION_RESPONSE: _dec_open_session_resp,
    MsgType.QUERY: _dec_query,
    MsgType.QUERY_RESPONSE: _dec_query_resp,
    MsgType.SNAPSHOT: _dec_snapshot,
    MsgType.SNAPSHOT_RESPONSE: _dec_snapshot_resp,
    MsgType.INSTALL: _dec_install,
    MsgType.INSTALL_RESPONSE: _dec_install_resp,
    MsgType.READ_INDEX: _dec_read_index,
    MsgType.READ_INDEX_RESPONSE: _dec_read_index_resp,
    MsgType.FETCH: _dec_fetch,
    MsgType.FETCH_RESPONSE: _dec_fetch_resp,
    MsgType.GET: _dec_get,
    MsgType.METADATA: _dec_metadata,
    MsgType.LEADERSHIP_TRANSFER: _dec_transfer,
    MsgType.MEMBER_CHANGE: _dec_member_change,
    MsgType.PUSH: _dec_push,
    MsgType.VOTE: _dec_vote,
    MsgType.HEARTBEAT: _dec_leader_term(HeartbeatRequest),
    MsgType.TAKE_LEADERSHIP: _dec_leader_term(TakeLeadershipRequest),
    MsgType.APPEND_RESPONSE: _dec_append_resp,
    MsgType.BATCH_APPEND_RESPONSE: _dec_batch_resp,
    MsgType.GET_RESPONSE: _dec_get_resp,
    MsgType.METADATA_RESPONSE: _dec_meta_resp,
    MsgType.TRANSFER_RESPONSE: _dec_plain_resp(TransferResponse),
    MsgType.PUSH_RESPONSE: _dec_push_resp,
    MsgType.VOTE_RESPONSE: _dec_vote_resp,
    MsgType.HEARTBEAT_RESPONSE: _dec_plain_resp(HeartbeatResponse),
    MsgType.TAKE_LEADERSHIP_RESPONSE: _dec_plain_resp(TakeLeadershipResponse),
    MsgType.ERROR_RESPONSE: _dec_error,
}
# Plain-int keyed copy: a dict lookup with the raw type byte, no enum construction per frame.
_DECODERS_BY_INT = {int(k): v for k, v in _DECODERS.items()}


def _as_view(frame: Buffer) -> memoryview:
    mv = frame if isinstance(frame, memoryview) else memoryview(frame)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    return mv


def peek_header(frame: Buffer) -> tuple[int, int, int] | None:
    """(version, type, request_id) of a frame whose 12-byte prefix is readable, else None.

    Lets a server answer a malformed request with an ErrorResponse that still carries the
    request id, so a pipelining client can match it.
    """
    try:
        mv = _as_view(frame)
    except (TypeError, ValueError):
        return None
    if len(mv) < HEADER_SIZE:
        return None
    version, mtype, _flags, rid = HEADER.unpack_from(mv, 0)
    return version, mtype, rid


def decode(frame: Buffer, max_frame: int = DEFAULT_MAX_FRAME,
           max_body: int = DEFAULT_MAX_BODY) -> Message:
    """Decode one frame. Returns a message or raises ProtocolError; never anything else.

    `max_frame` bounds the whole frame, `max_body` each client body (APPEND / BATCH_APPEND);
    blobs (PUSH entries, GET results) are bounded by `max_frame` only.
    """
    try:
        mv = _as_view(frame)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"not a byte buffer: {e}") from None
    n = len(mv)
    if n > max_frame:
        raise ProtocolError(f"oversize frame: {n} bytes > max {max_frame}")
    if n < HEADER_SIZE:
        raise ProtocolError(f"short frame: {n} bytes, the prefix alone needs {HEADER_SIZE}")
    version, mtype, _flags, rid = HEADER.unpack_from(mv, 0)
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this is {VERSION})")
    dec = _DECODERS_BY_INT.get(mtype)
    if dec is None:
        raise ProtocolError(f"unknown message type {mtype:#x}")
    try:
        msg = dec(mv, HEADER_SIZE, rid, max_body)
    except ProtocolError:
        raise
    except UnicodeDecodeError as e:
        raise ProtocolError(f"invalid UTF-8 in a string field: {e.reason}") from None
    except (struct.error, IndexError, ValueError) as e:
        raise ProtocolError(f"malformed {MsgType(mtype).name} frame: {e}") from None
    if _flags:
        _apply_flags(msg, _flags)
    return msg


def error_reply(frame_or_request: Buffer | Message | None, code: int, *, group: str = "",
                term: int = -1, leader_id: str = "", reason: str = "") -> ErrorResponse:
    """The ErrorResponse for a request we will not serve, echoing its request id if readable.

    Accepts a decoded request or the raw frame (when decoding failed), so the one place
    that catches ProtocolError can answer without knowing the message type.
    """
    rid, rtype = 0, 0
    if frame_or_request is None:
        pass
    elif isinstance(frame_or_request, (bytes, bytearray, memoryview)):
        hdr = peek_header(frame_or_request)
        if hdr is not None:
            _v, rtype, rid = hdr
    else:
        rid, rtype = frame_or_request.request_id, int(frame_or_request.TYPE)
    return ErrorResponse(int(code), group, term, leader_id, reason, rtype, rid)


def is_response(msg: Message) -> bool:
    """True for response types (their type byte has the high bit set)."""
    return msg.TYPE >= 0x80


# ---------------------------------------------------------------------------------------------
# Header flags (follower reads and puts answered at commit: docs/statemachine.md)
# ---------------------------------------------------------------------------------------------
FLAG_NO_RESULT = 0x01
"""APPEND: the client wants no state-machine result (a KV put: its revision is its index), so
the leader answers at commit instead of after its applier applied the entry. A node that does
not know the flag answers after applying, with the result: the same answer, later."""
FLAG_ANY_MEMBER = 0x02
"""QUERY: any member may answer. A follower asks the leader for a read index (READ_INDEX),
waits until its own state machine applied it, and answers from it (linearizable, as on the
leader). Without the flag a follower answers NOT_LEADER."""


def _apply_flags(msg: Message, flags: int) -> None:
    """The header flags this module knows, onto the decoded message; unknown bits and flags
    on other types are ignored (older nodes ignored them all)."""
    t = type(msg)
    if t is AppendRequest:
        msg.no_result = bool(flags & FLAG_NO_RESULT)
    elif t is QueryRequest:
        msg.any_member = bool(flags & FLAG_ANY_MEMBER)
