"""Group membership as data: the configuration, its log entry, and the rules of a change
(docs/membership.md). Pure: no I/O, no processes, no clocks.

Why a module of its own: every later step (the handler that appends a change, the elector and
the ack checker that count votes and acks, the supervisor that starts dispatchers, the CLI) must
agree on the same few rules, and they are only safe if they are exactly these:

* a node uses the NEWEST configuration in its log, committed or not (`latest_configuration`,
  `ConfigHistory`): a truncation can roll it back, so it is recomputed, never cached past one;
* one change at a time, each adding a learner, promoting one, or removing one member, so the
  voters of two consecutive configurations differ by at most one and any majority of one meets
  any majority of the other (`check_change`);
* a leader changes nothing until an entry of its own term has committed: without that rule two
  leaders of different terms can each append one change to the same old configuration and the
  two results can have disjoint majorities (the single-server-change bug found in 2015).

A configuration entry is a NOOP-magic entry whose body is `encode_configuration(...)` (the
term's NOOP has an empty body): readers that know nothing of membership (the applier, clients,
`dump`, the Spark readers) already skip NOOPs.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Protocol

from ipc.codes import ResponseCode as RC
from ipc.entry_codec import MAGIC_NOOP
from ipc.peers import MAX_STR, PeersError, format_peers, parse_peers

CONFIG_TAG: Final = b"DLCF"
"""First bytes of a configuration entry's body: a NOOP body that does not start with them is
not ours and is refused (no other NOOP body exists)."""
CONFIG_VERSION: Final = 1
MAX_MEMBERS: Final = 16
"""Voters + learners one configuration may hold: the peer slots the planned state block
reserves (docs/membership.md "Processes"). A change past it is TOO_MANY_MEMBERS."""
PUBLIC_KEY_LEN: Final = 40
"""A CurveZMQ public key in Z85 text, as in a `--keys-dir` member file `ID.key`."""

_HEAD = struct.Struct(">4sBH")  # tag, version, member count
_VOTER: Final = 0x01


class ConfigurationError(ValueError):
    """A configuration that cannot be (bad members) or bytes that are not one. One line."""


@dataclass(frozen=True, slots=True)
class Member:
    """One member: `voter` False is a learner. `public_key` is "" when the group runs without
    keys."""

    id: str
    host: str
    port: int
    voter: bool = True
    public_key: str = ""

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


@dataclass(frozen=True, slots=True)
class Configuration:
    """The members of a group as of the log entry at `index` (-1: the bootstrap configuration
    from `--peers`, which no entry holds). Member order is kept: it is the peers order."""

    members: tuple[Member, ...]
    index: int = -1

    def __post_init__(self) -> None:
        problem = _problem(self.members)
        if problem:
            raise ConfigurationError(problem)

    @property
    def voters(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.members if m.voter)

    @property
    def learners(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.members if not m.voter)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.members)

    @property
    def addresses(self) -> dict[str, tuple[str, int]]:
        return {m.id: m.address for m in self.members}

    def member(self, node_id: str) -> Member | None:
        for m in self.members:
            if m.id == node_id:
                return m
        return None

    def is_voter(self, node_id: str) -> bool:
        m = self.member(node_id)
        return m is not None and m.voter

    @property
    def quorum_size(self) -> int:
        """Votes or acks that make a majority of the voters (learners never count)."""
        return len(self.voters) // 2 + 1

    def is_quorum(self, ids: Iterable[str]) -> bool:
        """True if `ids` (voters or not, repeats ignored) hold a majority of the voters."""
        voters = set(self.voters)
        return len(voters.intersection(ids)) >= self.quorum_size

    def quorum_index(self, match: Mapping[str, int]) -> int:
        """The highest index stored on a majority of the voters: the ack checker's quorum index.
        `match` maps a member id to its watermark (the leader's own ledger end included); a voter
        missing from it counts as -1, a learner or a stranger in it does not count."""
        marks = sorted((match.get(v, -1) for v in self.voters), reverse=True)
        return marks[self.quorum_size - 1]

    def with_index(self, index: int) -> Configuration:
        return Configuration(self.members, index)

    def peers_string(self) -> str:
        """Every member (learners too) in `--peers` format: what a joining node is given."""
        return format_peers(self.addresses)


def _problem(members: tuple[Member, ...]) -> str:
    """Why `members` is not a configuration, or ""."""
    if not any(m.voter for m in members):
        return "a configuration needs at least one voter"
    if len(members) > MAX_MEMBERS:
        return f"{len(members)} members, at most {MAX_MEMBERS}"
    ids: set[str] = set()
    addrs: set[tuple[str, int]] = set()
    for m in members:
        if not m.id or "-" in m.id or len(m.id.encode("utf-8")) > MAX_STR:
            return f"member id {m.id!r}: 1..{MAX_STR} bytes, no '-'"
        if not m.host or len(m.host.encode("utf-8")) > 255:
            return f"member {m.id}: host must be 1..255 bytes"
        if not 1 <= m.port <= 65534:  # port + 1 is the elector's
            return f"member {m.id}: port {m.port} outside 1..65534"
        if m.public_key and (len(m.public_key) != PUBLIC_KEY_LEN or not m.public_key.isascii()):
            return f"member {m.id}: public key must be {PUBLIC_KEY_LEN} Z85 characters"
        if m.id in ids:
            return f"member id {m.id} appears twice"
        if m.address in addrs:
            return f"address {m.host}:{m.port} appears twice"
        ids.add(m.id)
        addrs.add(m.address)
    return ""


def bootstrap_configuration(peers: str | Mapping[str, tuple[str, int]],
                            keys: Mapping[str, str] | None = None) -> Configuration:
    """The configuration before any configuration entry: every `--peers` member a voter, in
    the peers order (a string, or the parsed ``{id: (host, port)}``)."""
    try:
        parsed = parse_peers(peers) if isinstance(peers, str) else peers
    except PeersError as e:
        raise ConfigurationError(str(e)) from None
    keys = keys or {}
    return Configuration(tuple(Member(i, h, p, True, keys.get(i, "")) for i, (h, p) in parsed.items()))


# --------------------------------------------------------------------------------------------
# The entry body
# --------------------------------------------------------------------------------------------
def encode_configuration(config: Configuration) -> bytes:
    """The body of a configuration entry (big-endian)::

        "DLCF" u8 version u16 count, then per member:
        u8 flags (bit 0: voter) u8 len id  u8 len host  u16 port  u8 len public_key

    The index is not in the body: it is the entry's own index."""
    out = [_HEAD.pack(CONFIG_TAG, CONFIG_VERSION, len(config.members))]
    for m in config.members:
        out.append(bytes([_VOTER if m.voter else 0]))
        for text in (m.id, m.host):
            b = text.encode("utf-8")
            out.append(bytes([len(b)]) + b)
        out.append(struct.pack(">H", m.port))
        k = m.public_key.encode("ascii")
        out.append(bytes([len(k)]) + k)
    return b"".join(out)


def is_configuration_body(magic: int, body: bytes | memoryview) -> bool:
    """True for the entries that hold a configuration: a NOOP with a non-empty body."""
    return magic == MAGIC_NOOP and len(body) > 0


def decode_configuration(body: bytes | memoryview, index: int) -> Configuration:
    """Strict inverse of `encode_configuration`. Anything else (a short body, another tag, a
    newer version, trailing bytes, bad UTF-8, a configuration `Configuration` refuses) raises
    ConfigurationError naming the entry, never another exception."""
    b = bytes(body)
    try:
        if len(b) < _HEAD.size:
            raise ConfigurationError(f"{len(b)} bytes, shorter than the {_HEAD.size}-byte head")
        tag, version, count = _HEAD.unpack_from(b, 0)
        if tag != CONFIG_TAG:
            raise ConfigurationError(f"tag {tag!r}, expected {CONFIG_TAG!r}")
        if version != CONFIG_VERSION:
            raise ConfigurationError(f"version {version}; this node reads version {CONFIG_VERSION}")
        if count > MAX_MEMBERS:
            raise ConfigurationError(f"{count} members, at most {MAX_MEMBERS}")
        off, members = _HEAD.size, []
        for _ in range(count):
            flags = _take(b, off, 1)[0]
            off += 1
            if flags & ~_VOTER:
                raise ConfigurationError(f"unknown member flags {flags:#x}")
            node_id, off = _text(b, off, "utf-8")
            host, off = _text(b, off, "utf-8")
            port = struct.unpack(">H", _take(b, off, 2))[0]
            off += 2
            key, off = _text(b, off, "ascii")
            members.append(Member(node_id, host, port, bool(flags & _VOTER), key))
        if off != len(b):
            raise ConfigurationError(f"{len(b) - off} bytes after the last member")
        return Configuration(tuple(members), index)
    except ConfigurationError as e:
        raise ConfigurationError(f"configuration entry {index}: {e}") from None


def _take(b: bytes, off: int, n: int) -> bytes:
    if off + n > len(b):
        raise ConfigurationError(f"truncated at byte {off} (needs {n} more, body has {len(b)})")
    return b[off:off + n]


def _text(b: bytes, off: int, encoding: str) -> tuple[str, int]:
    n = _take(b, off, 1)[0]
    raw = _take(b, off + 1, n)
    try:
        return raw.decode(encoding), off + 1 + n
    except UnicodeDecodeError:
        raise ConfigurationError(f"bad {encoding} text at byte {off + 1}") from None


# --------------------------------------------------------------------------------------------
# Which configuration is in force
# --------------------------------------------------------------------------------------------
class EntryLike(Protocol):
    index: int
    magic: int
    body: bytes | memoryview


def latest_configuration(entries: Iterable[EntryLike], base: Configuration) -> Configuration:
    """The configuration a node uses: the one of its newest configuration entry, COMMITTED OR
    NOT, else `base` (a snapshot's configuration, or the bootstrap one from `--peers`).

    `entries` are what the node's log holds now (after any truncation); the newest by index
    wins, so `base` wins only over entries older than the one it came from. A damaged entry
    raises ConfigurationError: guessing would let two nodes count different majorities."""
    best = base
    for e in entries:
        if is_configuration_body(e.magic, e.body) and e.index > best.index:
            best = decode_configuration(e.body, e.index)
    return best


class ConfigHistory:
    """The configuration entries a node holds, kept as the log changes, so the newest is known
    without rescanning the log after each append or truncation (a 1 GiB log has few of them).

    Invariant: `latest` == `latest_configuration(log entries now, base)`."""

    def __init__(self, base: Configuration) -> None:
        self.base = base
        self._entries: list[Configuration] = []  # ascending index, all > base.index

    @property
    def latest(self) -> Configuration:
        return self._entries[-1] if self._entries else self.base

    def appended(self, index: int, magic: int, body: bytes | memoryview) -> Configuration:
        """The log now holds this entry at `index` (entries arrive in index order)."""
        if is_configuration_body(magic, body) and index > self.latest.index:
            self._entries.append(decode_configuration(body, index))
        return self.latest

    def truncated(self, from_index: int) -> Configuration:
        """Entries at `from_index` and after were removed: their configurations go with them."""
        while self._entries and self._entries[-1].index >= from_index:
            self._entries.pop()
        return self.latest

    def compacted(self, snapshot: Configuration) -> Configuration:
        """A snapshot (taken or installed) covers the log up to an index and carries the
        configuration it was taken under: it becomes the base; older entries are forgotten."""
        if snapshot.index >= self.base.index:
            self.base = snapshot
            self._entries = [c for c in self._entries if c.index > snapshot.index]
        return self.latest


# --------------------------------------------------------------------------------------------
# Publishing by peer slot (the state block's ledger group: config_index/_voters/_learners)
# --------------------------------------------------------------------------------------------
def voter_slot_set(voters_mask: int, n_slots: int) -> frozenset[int]:
    """The slots whose bit is set (0: every slot, the bootstrap configuration)."""
    if voters_mask == 0:
        return frozenset(range(n_slots))
    return frozenset(i for i in range(n_slots) if voters_mask >> i & 1)


# --------------------------------------------------------------------------------------------
# Changes
# --------------------------------------------------------------------------------------------
class ChangeKind(IntEnum):
    ADD_LEARNER = 1  # a new member, as a learner: it receives the log, never votes
    PROMOTE = 2  # a caught-up learner becomes a voter
    REMOVE = 3  # a voter or a learner leaves


@dataclass(frozen=True, slots=True)
class Change:
    kind: ChangeKind
    id: str
    host: str = ""
    port: int = 0
    public_key: str = ""


@dataclass(frozen=True, slots=True)
class CatchUp:
    """When a learner is "caught up": its acknowledged log end is within `max_entries` entries
    AND `max_bytes` bytes of the leader's end, and it answered recently (`alive`). A distance,
    not a ratio: 90% of a 1 GiB log leaves 100 MiB to fetch, and a fixed distance stays
    reachable for a log that keeps growing, as long as the learner replicates faster than the
    log grows. The defaults are what one push pipeline moves well inside an election timeout."""

    max_entries: int = 1000
    max_bytes: int = 8 << 20


@dataclass(frozen=True, slots=True)
class LearnerProgress:
    """One snapshot of the learner's peer record and the leader's ledger end (positions are
    byte offsets in the data list: the end of the last entry stored)."""

    match_index: int
    match_end_pos: int
    alive: bool
    leader_end_index: int
    leader_end_pos: int


def caught_up(p: LearnerProgress, rule: CatchUp = CatchUp()) -> bool:
    """The promotion predicate (above)."""
    return (p.alive and p.leader_end_index - p.match_index <= rule.max_entries
            and p.leader_end_pos - p.match_end_pos <= rule.max_bytes)


@dataclass(frozen=True, slots=True)
class LeaderState:
    """What the leader knows when a change request arrives, read once (one snapshot per
    decision): the index its term's NOOP got and the committed index."""

    term_first_index: int
    committed_index: int


def check_change(current: Configuration, change: Change, leader: LeaderState,
                 progress: LearnerProgress | None = None, rule: CatchUp = CatchUp()) -> RC:
    """SUCCESS if the leader may append `apply_change(current, change, ...)` now, else the code
    of the first refusal (docs/membership.md "Refusals"). `current` must be the newest
    configuration in the leader's log; `progress` is needed for PROMOTE."""
    if leader.committed_index < leader.term_first_index or leader.term_first_index < 0:
        return RC.TERM_NOT_READY  # no entry of this leader's term committed yet
    if current.index > leader.committed_index:
        return RC.MEMBERSHIP_CHANGE_IN_PROGRESS
    m = current.member(change.id)
    if change.kind == ChangeKind.ADD_LEARNER:
        if m is not None:
            same = m.address == (change.host, change.port) and not m.voter
            return RC.MEMBERSHIP_NO_CHANGE if same else RC.MEMBER_EXISTS
        if (change.host, change.port) in current.addresses.values():
            return RC.MEMBER_EXISTS
        if len(current.members) >= MAX_MEMBERS:
            return RC.TOO_MANY_MEMBERS
        try:  # the same checks a configuration holding it gets (id, host, port, key)
            apply_change(current, change, current.index + 1)
        except ConfigurationError:
            return RC.UNEXPECTED_ARGUMENT
        return RC.SUCCESS
    if m is None:
        return RC.UNKNOWN_MEMBER
    if change.kind == ChangeKind.PROMOTE:
        if m.voter:
            return RC.MEMBERSHIP_NO_CHANGE
        if progress is None or not caught_up(progress, rule):
            return RC.LEARNER_BEHIND
        return RC.SUCCESS
    if change.kind == ChangeKind.REMOVE:
        if m.voter and len(current.voters) == 1:
            return RC.LAST_VOTER
        return RC.SUCCESS
    return RC.UNEXPECTED_ARGUMENT


def apply_change(current: Configuration, change: Change, index: int) -> Configuration:
    """The configuration after `change` (which `check_change` accepted), as the entry at
    `index` will hold it. Raises ConfigurationError for a change that makes no configuration."""
    if change.kind == ChangeKind.ADD_LEARNER:
        new = Member(change.id, change.host, change.port, False, change.public_key)
        return Configuration(current.members + (new,), index)
    if current.member(change.id) is None:
        raise ConfigurationError(f"{change.id} is not a member")
    if change.kind == ChangeKind.PROMOTE:
        return Configuration(tuple(Member(m.id, m.host, m.port, True, m.public_key)
                                   if m.id == change.id else m for m in current.members), index)
    if change.kind == ChangeKind.REMOVE:
        return Configuration(tuple(m for m in current.members if m.id != change.id), index)
    raise ConfigurationError(f"unknown change kind {change.kind}")


def majorities_intersect(a: Configuration, b: Configuration) -> bool:
    """True if every majority of `a`'s voters meets every majority of `b`'s: the safety of a
    change from `a` to `b` (the simulator checks it for every two successive committed
    configurations). Without enumerating: two disjoint majorities exist exactly when each can
    be filled with as few shared voters as possible and the shared voters suffice for both
    (a majority of `a` takes every voter `b` lacks first, then shared ones)."""
    va, vb = set(a.voters), set(b.voters)
    shared = len(va & vb)
    need_a = max(0, a.quorum_size - len(va - vb))
    need_b = max(0, b.quorum_size - len(vb - va))
    return need_a + need_b > shared


def leader_steps_down(leader_id: str, config: Configuration, committed_index: int) -> bool:
    """A leader that is not a voter of its newest configuration leads until that configuration
    commits (it counts for nothing in it: the new voters' majority commits it), then steps
    down. Before the commit it must stay to finish the change."""
    return not config.is_voter(leader_id) and committed_index >= config.index


__all__ = [
    "CONFIG_TAG", "CONFIG_VERSION", "MAX_MEMBERS", "CatchUp", "Change", "ChangeKind",
    "ConfigHistory", "Configuration", "ConfigurationError", "LeaderState", "LearnerProgress",
    "Member", "apply_change", "voter_slot_set", "bootstrap_configuration", "caught_up", "check_change",
    "decode_configuration", "encode_configuration", "is_configuration_body",
    "latest_configuration", "leader_steps_down", "majorities_intersect",
]
