"""The node's state block: one shared-memory segment, one declared layout, one writer per field.

A node is a group of OS processes (supervisor, elector, handler, ack checker, one dispatcher per
peer; docs/design.md). They share the few facts that must be read on every hot-path step -- role, term,
leader, ledger end, committed index, each peer's watermark -- through this block instead of
messages, so a reader never waits for a writer and nothing is pickled. The rules that keep it
correct are simple and are checked by tests (tests/unit/test_shared_state.py):

* every field is a signed 64-bit integer at an 8-aligned offset, so every single-field write is
  one aligned 8-byte store and every single-field read one aligned 8-byte load (never torn);
* every field has exactly one writer role ("supervisor", "elector", "handler", "ack_checker",
  "dispatcher[p]"); nobody else stores to it, so counters can be plain read-add-store;
* fields that must be read together (role+term+leader..., ledger begin/end/term/committed, the
  quorum pair, one peer's watermark) form a *group* guarded by a seqlock (below).

Peers are named by *slot*: the position of the peer id in the configured peers list, 0..n-1;
-1 (``NO_SLOT``) means none. Times (``*_ms``) are CLOCK_MONOTONIC milliseconds
(:func:`monotonic_ms`), which Linux keeps system-wide, so they are comparable across processes
(not across reboots or hosts). Indices are -1 when the ledger is empty.

Layout (``P = 5248 + 256*p`` is the base of peer slot ``p``; records are 256 bytes so two
dispatchers never write the same cache line; sections of different writers start on 64-byte
boundaries; ``int64[n]`` rows are arrays of lock-free counters -- fixed-bucket histograms
(node/observe/histogram.py) and the request matrix (node/observe/request_counts.py) -- each with one writer). The table is rendered from ``LAYOUT``/``PEER_LAYOUT`` by
:func:`render_layout_table`; a test keeps this copy and docs/shared_state.md in sync:

| offset | type | field | writer | group |
|---:|---|---|---|---|
| 0 | int64 | magic | supervisor | - |
| 8 | int64 | layout_version | supervisor | - |
| 16 | int64 | total_size | supervisor | - |
| 24 | int64 | n_peers | supervisor | - |
| 32 | int64 | self_slot | supervisor | - |
| 40 | int64 | supervisor_pid | supervisor | - |
| 48 | int64 | generation | supervisor | - |
| 64 | int64 | member_seq | elector | member (seq) |
| 72 | int64 | role | elector | member |
| 80 | int64 | current_term | elector | member |
| 88 | int64 | leader_slot | elector | member |
| 96 | int64 | voted_for_slot | elector | member |
| 104 | int64 | transferee_slot | elector | member |
| 112 | int64 | role_epoch | elector | member |
| 120 | int64 | last_leader_heartbeat_ms | elector | member |
| 128 | int64 | last_quorum_heartbeat_ms | elector | member |
| 136 | int64 | elector_beat_ms | elector | - |
| 144 | int64 | votes_requested | elector | - |
| 152 | int64 | votes_granted | elector | - |
| 160 | int64 | elections_started | elector | - |
| 168 | int64 | heartbeats_sent | elector | - |
| 176 | int64 | role_changes | elector | - |
| 184 | int64 | elector_bad_frames | elector | - |
| 192 | int64 | elections_won | elector | - |
| 200 | int64 | leader_changes | elector | - |
| 208 | int64 | last_leader_change_ms | elector | - |
| 216 | int64 | not_voting | elector | - |
| 224 | int64 | elector_auth_refused | elector | - |
| 256 | int64 | ledger_seq | handler | ledger (seq) |
| 264 | int64 | ledger_begin_index | handler | ledger |
| 272 | int64 | ledger_end_index | handler | ledger |
| 280 | int64 | ledger_end_term | handler | ledger |
| 288 | int64 | committed_index | handler | ledger |
| 296 | int64 | store_generation | handler | ledger |
| 304 | int64 | config_index | handler | ledger |
| 312 | int64 | config_voters | handler | ledger |
| 320 | int64 | config_learners | handler | ledger |
| 328 | int64 | handler_beat_ms | handler | - |
| 336 | int64 | appends | handler | - |
| 344 | int64 | append_errors | handler | - |
| 352 | int64 | gets | handler | - |
| 360 | int64 | push_requests | handler | - |
| 368 | int64 | bad_frames | handler | - |
| 376 | int64 | entries_appended | handler | - |
| 384 | int64 | commits_published | handler | - |
| 392 | int64 | store_unwritable_ms | handler | - |
| 400 | int64 | pending_appends | handler | - |
| 408 | int64 | bytes_appended | handler | - |
| 416 | int64 | ledger_end_pos | handler | - |
| 424 | int64 | retention_files_deleted | handler | - |
| 432 | int64 | repair_index | handler | - |
| 440 | int64 | unchecked_end_index | handler | - |
| 448 | int64 | fetches | handler | - |
| 456 | int64 | fetched_entries | handler | - |
| 464 | int64 | auth_refused | handler | - |
| 512 | int64 | quorum_seq | ack_checker | quorum (seq) |
| 520 | int64 | quorum_index | ack_checker | quorum |
| 528 | int64 | quorum_term | ack_checker | quorum |
| 536 | int64 | ack_checker_beat_ms | ack_checker | - |
| 544 | int64 | quorum_advances | ack_checker | - |
| 552 | int64 | ack_timeouts | ack_checker | - |
| 576 | int64 | snapshot_seq | applier | snapshot (seq) |
| 584 | int64 | snapshot_index | applier | snapshot |
| 592 | int64 | snapshot_term | applier | snapshot |
| 600 | int64 | applier_beat_ms | applier | - |
| 608 | int64 | applied_index | applier | - |
| 616 | int64 | entries_applied | applier | - |
| 624 | int64 | snapshots_taken | applier | - |
| 632 | int64 | queries_served | applier | - |
| 640 | int64[14] | append_latency_ms | handler | - |
| 768 | int64[14] | append_batch_entries | handler | - |
| 896 | int64[14] | fsync_us | handler | - |
| 1024 | int64[517] | requests | handler | - |
| P+0 | int64 | peer[p].seq | dispatcher[p] | peer[p] (seq) |
| P+8 | int64 | peer[p].match_index | dispatcher[p] | peer[p] |
| P+16 | int64 | peer[p].match_term | dispatcher[p] | peer[p] |
| P+24 | int64 | peer[p].alive | dispatcher[p] | peer[p] |
| P+32 | int64 | peer[p].last_ack_ms | dispatcher[p] | peer[p] |
| P+40 | int64 | peer[p].beat_ms | dispatcher[p] | - |
| P+48 | int64 | peer[p].pushes_sent | dispatcher[p] | - |
| P+56 | int64 | peer[p].entries_pushed | dispatcher[p] | - |
| P+64 | int64 | peer[p].bytes_pushed | dispatcher[p] | - |
| P+72 | int64 | peer[p].match_pos | dispatcher[p] | - |
| P+80 | int64[14] | peer[p].replication_latency_ms | dispatcher[p] | - |

Total size: ``5248 + 256 * 16`` bytes: always ``PEER_RECORDS`` (16) peer records, the most
members a configuration may have, so a member added while the group runs has a record without
a new block; ``n_peers`` is the number of ``--peers`` members, slots 0..n_peers-1 (layout version 6: version 5
had ``n_peers`` records; version 4 had no configuration words in the ledger group; version 3 had no metrics
words, histograms or request matrix and 128-byte peer records). The record of ``self_slot`` is never written (no
dispatcher pushes to itself; the ack checker takes this node's own watermark from the ledger
group).

Seqlock protocol and why it is correct here
-------------------------------------------
Writer (the group's only writer)::

    seq += 1          # now odd: "writing"
    store the fields
    seq += 1          # even again: "stable"

Reader: load seq (retry while odd); copy the fields; load seq again; accept the copy only if
both loads were equal. Readers never block writers, and writers never wait.

Ordering. The writer's three steps are separate CPython calls; each ends in plain C stores
(``memcpy`` of 8 bytes into the mapping). The C compiler cannot move them across those opaque
calls. The remaining question is the CPU: x86-64 is TSO -- stores become visible in program
order, and loads are not reordered with older loads -- which is exactly what a seqlock needs
(Linux's x86 ``smp_wmb``/``smp_rmb`` are compiler barriers only). On weakly ordered CPUs
(aarch64, POWER, RISC-V) the writer needs a store-store fence after the odd store and before the
even store, and the reader a load-load fence after the first seq load and before the second;
Python exposes no fence, so supporting them would need a tiny C helper
(``atomic_thread_fence``) or a per-group lock instead. We therefore check ``platform.machine()``
at create/attach and refuse anything but x86-64 (:class:`UnsupportedPlatformError`).

Single-word accesses go through ``memoryview.cast("q")`` item get/set, which CPython implements
as one ``memcpy`` of ``sizeof(long long)`` (one aligned 8-byte load or store). We deliberately do
*not* use ``struct.pack_into`` for lock-free words: ``s_pack_internal`` first ``memset``s the
destination to zero and then stores the value, so a concurrent reader could see a transient 0 --
harmless inside a seqlock-protected group (seq is odd meanwhile), fatal for a seq word or a
counter. A group body is encoded with a precompiled ``struct.Struct`` (native ``@`` format)
*before* seq goes odd -- so a bad value raises before anything is touched -- and copied in with
one slice assignment (``memmove``); readers copy it out with ``Struct.unpack_from``.

A writer that dies between its two seq stores leaves seq odd. Readers spin briefly, then back off
(sleeping up to 1 ms) and after ``read_timeout_s`` raise :class:`SeqlockTimeout` -- they never
hang. The supervisor restarts the dead role; the restarted role calls :meth:`repair_seqs` for the
groups it owns (odd seq -> next even value) and then rewrites the whole group from its
authoritative source (term/vote file, store), because the fields of an interrupted write may be
half old, half new. Every ``write_*`` also repairs an odd seq it finds, so a writer cannot
publish a torn group as stable. Repair must only run after the previous incarnation is known to
be dead (the supervisor has reaped it), or two writers would share a group.

Lifecycle
---------
* :func:`segment_name` derives a short deterministic name from (group, node id, store dir), so
  a restarted supervisor finds the segment a killed one left behind.
* :meth:`SharedState.create` (supervisor only) removes such a stale segment (logged), creates a
  fresh one, initialises every field and writes ``magic`` last. The creator registers the
  segment with multiprocessing's resource tracker, so if the supervisor is SIGKILLed its tracker
  unlinks the segment.
* :meth:`SharedState.attach` (every other process) validates magic, version and size and never
  touches the resource tracker (CPython gh-82300: on 3.11 ``SharedMemory(name)`` registers the
  segment in the *attaching* process, whose tracker then unlinks it -- under the node's feet --
  and warns about a "leak" when that process exits).
* :meth:`SharedState.close` unmaps; :meth:`SharedState.unlink` removes the name (supervisor, at
  clean stop). Both are idempotent; the object is a context manager that closes on exit.
"""

from __future__ import annotations

# CPython's own POSIX shared-memory primitives (what multiprocessing.shared_memory uses). We call
# them directly so that attaching never registers with the resource tracker (see attach()).
import _posixshmem
import functools
import hashlib
import logging
import mmap
import os
import platform
import re
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Final

from ipc.codes import Role  # canonical Role; re-exported here for the block's users
from node.observe import request_counts
from node.observe.histogram import NODE_HISTOGRAMS, PEER_HISTOGRAMS, HistogramSpec, HistogramWriter

log = logging.getLogger("dledger.shared_state")

MAGIC: Final = int.from_bytes(b"DLedgSB1", "little")
LAYOUT_VERSION: Final = 6
NO_SLOT: Final = -1
NO_INDEX: Final = -1

SUPPORTED_MACHINES: Final = frozenset({"x86_64", "amd64", "AMD64"})
DEFAULT_READ_TIMEOUT_S: Final = 2.0
_SPIN_TRIES: Final = 200  # ~0.2 ms of tight retries before backing off
_MAX_BACKOFF_S: Final = 0.001
_MAX_NAME_LEN: Final = 30

FIXED_ROLES: Final = ("supervisor", "elector", "handler", "ack_checker", "applier")
_DISPATCHER_RE: Final = re.compile(r"dispatcher\[(\d+)\]")


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class SharedStateError(RuntimeError):
    """Base class: anything wrong with the state block itself (not with Raft)."""


class SegmentNotFound(SharedStateError, FileNotFoundError):
    """attach() found no segment: the supervisor is not running (or another store/node id)."""


class LayoutMismatch(SharedStateError):
    """The segment exists but is not a state block of this layout version (or is truncated)."""


class SeqlockTimeout(SharedStateError, TimeoutError):
    """A group stayed odd/changing for read_timeout_s: its writer probably died mid-write."""


class NotTheWriter(SharedStateError, PermissionError):
    """A process attached as role R tried to store to a field another role owns."""


class UnsupportedPlatformError(SharedStateError):
    """The CPU's memory model is weaker than the seqlock's assumptions (see module docstring)."""


# --------------------------------------------------------------------------------------------
# The layout, declared once
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field: ``offset`` is absolute for LAYOUT and relative to the record for PEER_LAYOUT.

    ``group`` names the seqlock group the field belongs to (``None`` for lock-free single words);
    ``is_seq`` marks the group's sequence word.
    """

    name: str
    fmt: str
    offset: int
    writer: str
    group: str | None
    is_seq: bool = False


def _section(
    start: int, writer: str, group: str | None, names: tuple[str, ...], seq_name: str | None
) -> tuple[tuple[FieldSpec, ...], int]:
    """Lay out ``names`` (after an optional seq word) from ``start``; return fields and end."""
    fields: list[FieldSpec] = []
    off = start
    if seq_name is not None:
        fields.append(FieldSpec(seq_name, "q", off, writer, group, is_seq=True))
        off += 8
    for n in names:
        fields.append(FieldSpec(n, "q", off, writer, group if seq_name is not None else None))
        off += 8
    return tuple(fields), off


def _align(off: int, to: int = 64) -> int:
    return (off + to - 1) // to * to


def _build_layout() -> tuple[tuple[FieldSpec, ...], int]:
    out: list[FieldSpec] = []
    # header -- the supervisor writes it at create (and pid/generation later)
    f, end = _section(
        0,
        "supervisor",
        None,
        ("magic", "layout_version", "total_size", "n_peers", "self_slot", "supervisor_pid",
         "generation"),
        None,
    )
    out += f
    # elector: the member group (one consistent snapshot) then its own lock-free words
    f, end = _section(
        _align(end),
        "elector",
        "member",
        ("role", "current_term", "leader_slot", "voted_for_slot", "transferee_slot", "role_epoch",
         "last_leader_heartbeat_ms", "last_quorum_heartbeat_ms"),
        "member_seq",
    )
    out += f
    f, end = _section(
        end,
        "elector",
        None,
        ("elector_beat_ms", "votes_requested", "votes_granted", "elections_started",
         "heartbeats_sent", "role_changes", "elector_bad_frames", "elections_won",
         "leader_changes", "last_leader_change_ms", "not_voting", "elector_auth_refused"),
        None,
    )
    out += f
    # handler: the ledger group then counters
    f, end = _section(
        _align(end),
        "handler",
        "ledger",
        ("ledger_begin_index", "ledger_end_index", "ledger_end_term", "committed_index",
         "store_generation", "config_index", "config_voters", "config_learners"),
        "ledger_seq",
    )
    out += f
    f, end = _section(
        end, "handler", None,
        ("handler_beat_ms", "appends", "append_errors", "gets", "push_requests", "bad_frames",
         "entries_appended", "commits_published", "store_unwritable_ms", "pending_appends",
         "bytes_appended", "ledger_end_pos", "retention_files_deleted", "repair_index",
         "unchecked_end_index", "fetches", "fetched_entries", "auth_refused"), None,
    )
    out += f
    # ack checker: quorum index+term are a pair, so they get a seqlock too
    f, end = _section(
        _align(end), "ack_checker", "quorum", ("quorum_index", "quorum_term"), "quorum_seq"
    )
    out += f
    f, end = _section(end, "ack_checker", None,
                      ("ack_checker_beat_ms", "quorum_advances", "ack_timeouts"), None)
    out += f
    # applier (only with a state machine): the newest snapshot's position is a pair; what has
    # been applied is one word, read on its own (a lower bound that only grows)
    f, end = _section(
        _align(end), "applier", "snapshot", ("snapshot_index", "snapshot_term"), "snapshot_seq"
    )
    out += f
    f, end = _section(end, "applier", None,
                      ("applier_beat_ms", "applied_index", "entries_applied", "snapshots_taken",
                       "queries_served"), None)
    out += f
    # arrays (histograms, the request matrix): each starts on its own cache line
    arrays: list[ArraySpec] = []
    for h in NODE_HISTOGRAMS:
        arrays.append(ArraySpec(h.name, _align(end), h.words, "handler"))
        end = arrays[-1].offset + 8 * h.words
    arrays.append(ArraySpec("requests", _align(end), request_counts.WORDS, "handler"))
    end = arrays[-1].offset + 8 * request_counts.WORDS
    return tuple(out), tuple(arrays), _align(end, 128)


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """``count`` consecutive int64 words with one writer (histograms, the request matrix).

    Each word is a lock-free counter of its own; ``offset`` is absolute for ARRAYS and relative
    to the record for PEER_ARRAYS."""

    name: str
    offset: int
    count: int
    writer: str


LAYOUT, ARRAYS, PEERS_OFFSET = _build_layout()

_peer_group, _end = _section(
    0, "dispatcher[p]", "peer", ("match_index", "match_term", "alive", "last_ack_ms"), "seq"
)
_peer_words, _end = _section(
    _end, "dispatcher[p]", None,
    ("beat_ms", "pushes_sent", "entries_pushed", "bytes_pushed", "match_pos"), None,
)
PEER_LAYOUT: Final = _peer_group + _peer_words
_peer_arrays: list[ArraySpec] = []
for _h in PEER_HISTOGRAMS:
    _peer_arrays.append(ArraySpec(_h.name, _end, _h.words, "dispatcher[p]"))
    _end += 8 * _h.words
PEER_ARRAYS: Final = tuple(_peer_arrays)
PEER_STRIDE: Final = 256
assert _end <= PEER_STRIDE
del _peer_group, _peer_words, _end, _peer_arrays, _h

FIELDS: Final = {f.name: f for f in LAYOUT}
PEER_FIELDS: Final = {f.name: f for f in PEER_LAYOUT}
ARRAY_FIELDS: Final = {a.name: a for a in ARRAYS}
PEER_ARRAY_FIELDS: Final = {a.name: a for a in PEER_ARRAYS}
HISTOGRAMS: Final = {h.name: h for h in NODE_HISTOGRAMS + PEER_HISTOGRAMS}
_IMMUTABLE: Final = frozenset({"magic", "layout_version", "total_size", "n_peers", "self_slot"})


PEER_RECORDS: Final = 16  # node.core.membership.MAX_MEMBERS (a test keeps them equal)


def layout_size(n_peers: int = PEER_RECORDS) -> int:
    """Bytes of a block: the same for every group of 1..PEER_RECORDS ``--peers`` members (the
    block always holds PEER_RECORDS peer records; docs/membership.md "Processes")."""
    if not 1 <= n_peers <= PEER_RECORDS:
        raise ValueError(f"{n_peers} peers: a block holds 1..{PEER_RECORDS}")
    return PEERS_OFFSET + PEER_STRIDE * PEER_RECORDS


def render_layout_table() -> str:
    """The markdown layout table shown in this docstring and docs/shared_state.md."""
    rows = ["| offset | type | field | writer | group |", "|---:|---|---|---|---|"]

    def grp(f: FieldSpec, label: str | None) -> str:
        if f.group is None:
            return "-"
        return f"{label} (seq)" if f.is_seq else str(label)

    for f in LAYOUT:
        rows.append(f"| {f.offset} | int64 | {f.name} | {f.writer} | {grp(f, f.group)} |")
    for a in ARRAYS:
        rows.append(f"| {a.offset} | int64[{a.count}] | {a.name} | {a.writer} | - |")
    for f in PEER_LAYOUT:
        rows.append(
            f"| P+{f.offset} | int64 | peer[p].{f.name} | {f.writer} | {grp(f, 'peer[p]')} |"
        )
    for a in PEER_ARRAYS:
        rows.append(f"| P+{a.offset} | int64[{a.count}] | peer[p].{a.name} | {a.writer} | - |")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeaderView:
    magic: int
    layout_version: int
    total_size: int
    n_peers: int
    self_slot: int
    supervisor_pid: int
    generation: int


@dataclass(frozen=True, slots=True)
class MemberView:
    """One consistent snapshot of the elector's member group."""

    role: Role
    current_term: int
    leader_slot: int
    voted_for_slot: int
    transferee_slot: int
    role_epoch: int
    last_leader_heartbeat_ms: int
    last_quorum_heartbeat_ms: int


@dataclass(frozen=True, slots=True)
class LedgerView:
    """One consistent snapshot of the handler's ledger group (-1 everywhere when empty)."""

    ledger_begin_index: int
    ledger_end_index: int
    ledger_end_term: int
    committed_index: int
    store_generation: int = 0
    """The store's generation counter (node/store, docs/contracts.md C1) when this snapshot was
    published: a reader passes it to ``StoreReader.begin``/``validate`` so it never uses bytes
    of a file a truncation replaced after the snapshot."""


@dataclass(frozen=True, slots=True)
class ConfigWords:
    """The newest configuration in the handler's log, as the ledger group's last three words
    (docs/membership.md). In the ledger group so that one snapshot gives a decision both the
    ledger end and the voter set it is counted against (`read_ledger_config`); a separate
    view so that `read_ledger`, on every dispatcher's push path, builds no more than before."""

    config_index: int = NO_INDEX
    """The index of the newest configuration entry in this node's log, committed or not (-1:
    none, the bootstrap configuration from ``--peers``)."""
    config_voters: int = 0
    """That configuration's voters as a bit mask over the peer slots (bit ``p``: slot ``p``);
    0 means "not published yet": the bootstrap configuration (every slot a voter)."""
    config_learners: int = 0
    """Its learners, the same way."""


@dataclass(frozen=True, slots=True)
class QuorumView:
    quorum_index: int
    quorum_term: int


@dataclass(frozen=True, slots=True)
class SnapshotView:
    snapshot_index: int
    snapshot_term: int


@dataclass(frozen=True, slots=True)
class PeerView:
    """Peer ``slot``'s watermark (consistent snapshot) plus its counters.

    The counters (beat_ms .. bytes_pushed) are read after the snapshot and are not part of it:
    they are monotonic statistics, not decisions.
    """

    slot: int
    match_index: int
    match_term: int
    alive: bool
    last_ack_ms: int
    beat_ms: int
    pushes_sent: int
    entries_pushed: int
    bytes_pushed: int
    match_pos: int = 0
    """The data-file position just after the follower's matched entry (its bytes held): with
    the handler's ``ledger_end_pos`` it gives the follower's lag in bytes."""


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def monotonic_ms() -> int:
    """CLOCK_MONOTONIC in ms: system-wide on Linux, so comparable between the node's processes."""
    return time.monotonic_ns() // 1_000_000


def segment_name(group: str, node_id: str, store_dir: str | os.PathLike[str]) -> str:
    """Deterministic short segment name for one node of one replication group.

    Deterministic so that a restarted supervisor finds (and removes) the segment a killed one
    left; short because macOS limits POSIX shm names to 31 bytes; keyed on the real store path
    so two nodes with the same id in different directories (tests) never collide.
    """
    key = "\0".join((group, node_id, os.path.realpath(os.fspath(store_dir))))
    return "dl_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def stop_resource_tracker() -> None:
    """Stop this process's multiprocessing resource tracker and reap it (the supervisor calls
    this last, after unlinking its block). Left running, the tracker outlives the supervisor by
    a moment, is orphaned to PID 1 and stays in the node's process group until PID 1 reaps it
    (over a second on some hosts): whoever waits for the node's process group to be gone waits
    for that too. No-op when no tracker was started. `_stop` is CPython's own (3.8+) way to end
    the tracker: it closes the tracker's pipe and waits for the process."""
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    stop = getattr(tracker, "_stop", None)
    if stop is not None:
        try:
            stop()
        except (OSError, ChildProcessError):
            pass


def check_platform() -> None:
    """Refuse CPUs whose memory model the seqlock does not cover (see the module docstring)."""
    machine = platform.machine()
    if machine not in SUPPORTED_MACHINES or struct.calcsize("P") != 8:
        raise UnsupportedPlatformError(
            f"shared state block needs x86-64 (total store order); this is {machine!r}: "
            "the seqlock would need explicit memory fences here"
        )


def _validate_name(name: str) -> None:
    if not name or "/" in name or len(name) > _MAX_NAME_LEN:
        raise ValueError(f"bad segment name {name!r}: 1..{_MAX_NAME_LEN} chars, no '/'")


def _open_mapping(name: str, size: int | None) -> mmap.mmap:
    """Create (size given) or open (size None) the POSIX segment and map it.

    Opening never involves multiprocessing's resource tracker; we use the same primitives as
    ``SharedMemory`` but skip its 3.11 behaviour of registering on attach (gh-82300) and of
    unlinking the segment if mapping fails in an attaching process.
    """
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if size is not None else 0)
    fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
    try:
        if size is not None:
            os.ftruncate(fd, size)
        else:
            size = os.fstat(fd).st_size
            if size < PEERS_OFFSET:
                raise LayoutMismatch(
                    f"segment {name!r} is {size} bytes, smaller than a state block header "
                    f"({PEERS_OFFSET}): not a DLedger state block or still being created"
                )
        return mmap.mmap(fd, size)
    except BaseException:
        if flags & os.O_CREAT:
            _posixshmem.shm_unlink("/" + name)
        raise
    finally:
        os.close(fd)  # the mapping keeps the memory; no need to hold the descriptor


def _unlink_raw(name: str) -> bool:
    """shm_unlink without telling any tracker (the name may not be registered here)."""
    try:
        _posixshmem.shm_unlink("/" + name)
        return True
    except FileNotFoundError:
        return False


def _peek_supervisor_pid(name: str) -> int | None:
    """Best effort: the supervisor pid recorded in a stale segment, for the log line."""
    try:
        mm = _open_mapping(name, None)
    except (OSError, ValueError, SharedStateError):
        return None
    try:
        magic, pid = struct.unpack_from("@q", mm, 0)[0], struct.unpack_from("@q", mm, 40)[0]
        return pid if magic == MAGIC else None
    finally:
        mm.close()


def _parse_writer(role: str, n_peers: int, self_slot: int) -> tuple[str, int | None]:
    if role in FIXED_ROLES:
        return role, None
    m = _DISPATCHER_RE.fullmatch(role)
    if m is None:
        raise ValueError(f"unknown role {role!r}: one of {FIXED_ROLES} or 'dispatcher[p]'")
    slot = int(m.group(1))
    # Any of the block's records: a member added later holds a slot past the --peers ones.
    if not 0 <= slot < PEER_RECORDS or slot == self_slot:
        raise ValueError(f"{role!r}: dispatcher slot must be a peer slot other than {self_slot}")
    return "dispatcher[p]", slot


def _struct_for(fields: tuple[FieldSpec, ...]) -> struct.Struct:
    return struct.Struct("@" + "".join(f.fmt for f in fields))


_MEMBER_BODY: Final = tuple(f for f in LAYOUT if f.group == "member" and not f.is_seq)
_LEDGER_BODY: Final = tuple(f for f in LAYOUT if f.group == "ledger" and not f.is_seq)
_QUORUM_BODY: Final = tuple(f for f in LAYOUT if f.group == "quorum" and not f.is_seq)
_SNAPSHOT_BODY: Final = tuple(f for f in LAYOUT if f.group == "snapshot" and not f.is_seq)
_PEER_BODY: Final = tuple(f for f in PEER_LAYOUT if f.group == "peer" and not f.is_seq)
_PEER_WORDS: Final = tuple(f for f in PEER_LAYOUT if f.group is None)
_MEMBER_S: Final = _struct_for(_MEMBER_BODY)
_LEDGER_S: Final = _struct_for(_LEDGER_BODY)  # every word, the configuration's too
_LEDGER_END: Final = tuple(f for f in _LEDGER_BODY if not f.name.startswith("config_"))
_LEDGER5_S: Final = _struct_for(_LEDGER_END)  # what LedgerView holds: a prefix of the group
_QUORUM_S: Final = _struct_for(_QUORUM_BODY)
_SNAPSHOT_S: Final = _struct_for(_SNAPSHOT_BODY)
_PEER_S: Final = _struct_for(_PEER_BODY)
_PEER_WORDS_S: Final = _struct_for(_PEER_WORDS)
_HEADER_S: Final = _struct_for(tuple(f for f in LAYOUT if f.writer == "supervisor"))
_SEQ_OF_GROUP: Final = {"member": "member_seq", "ledger": "ledger_seq", "quorum": "quorum_seq",
                         "snapshot": "snapshot_seq"}
_OWNED_GROUPS: Final = {"elector": ("member",), "handler": ("ledger",),
                        "ack_checker": ("quorum",), "applier": ("snapshot",), "supervisor": ()}
_BEAT_FIELD: Final = {"elector": "elector_beat_ms", "handler": "handler_beat_ms",
                      "ack_checker": "ack_checker_beat_ms", "applier": "applier_beat_ms"}


# --------------------------------------------------------------------------------------------
# The block
# --------------------------------------------------------------------------------------------


class SharedState:
    """A mapped state block. Use :meth:`create` (supervisor) or :meth:`attach` (roles).

    ``role`` (e.g. ``"handler"``, ``"dispatcher[2]"``) turns on the single-writer check: stores
    to fields owned by another role raise :class:`NotTheWriter`. ``None`` disables the check
    (tools that only read, tests).
    """

    def __init__(
        self, name: str, mm: mmap.mmap, *, owner: bool, role: str | None, read_timeout_s: float
    ) -> None:
        self.name = name
        self.read_timeout_s = read_timeout_s
        self.read_retries = 0  # process-local statistic: seqlock read attempts that were retried
        self._registered = owner  # the creator registered the name with its resource tracker
        self.n_peers: int = struct.unpack_from("@q", mm, FIELDS["n_peers"].offset)[0]
        self.self_slot: int = struct.unpack_from("@q", mm, FIELDS["self_slot"].offset)[0]
        self.role = role
        self._writer: str | None = None
        self._writer_slot: int | None = None
        if role is not None:  # validate before exporting buffers, so a failure can close mm
            self._writer, self._writer_slot = _parse_writer(role, self.n_peers, self.self_slot)
        self._mm: mmap.mmap | None = mm
        self._buf = memoryview(mm)
        self._w = self._buf.cast("q")  # one aligned 8-byte load/store per item (see docstring)

    # ---- lifecycle -----------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        name: str,
        n_peers: int,
        self_slot: int,
        *,
        role: str | None = None,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    ) -> SharedState:
        """Create and initialise the block (supervisor only), replacing a stale one.

        A segment with this name can only be left over from a killed run of the same node
        (the name is derived from group, node id and store dir), so it is unlinked and logged.
        The supervisor must make sure that run's role processes are gone first; they would keep
        writing to the old, now nameless, mapping and never see this one.
        """
        check_platform()
        _validate_name(name)
        if not 1 <= n_peers <= PEER_RECORDS or not 0 <= self_slot < n_peers:
            raise ValueError(f"need 1 <= n_peers <= {PEER_RECORDS} and 0 <= self_slot < n_peers, "
                             f"got {n_peers=} {self_slot=}")
        size = layout_size(n_peers)
        try:
            mm = _open_mapping(name, size)
        except FileExistsError:
            pid = _peek_supervisor_pid(name)
            log.warning("removing stale shared state block %s left by a previous run "
                        "(supervisor pid %s)", name, pid if pid is not None else "unknown")
            _unlink_raw(name)
            mm = _open_mapping(name, size)
        # The creator keeps the normal registration: if the supervisor is SIGKILLed, its resource
        # tracker (a separate process) unlinks the segment when it notices.
        resource_tracker.register("/" + name, "shared_memory")
        w = memoryview(mm).cast("q")
        try:
            w[FIELDS["n_peers"].offset // 8] = n_peers
            w[FIELDS["self_slot"].offset // 8] = self_slot
        finally:
            w.release()
        st = cls(name, mm, owner=True, role=role, read_timeout_s=read_timeout_s)
        st._initialise(size)
        return st

    def _initialise(self, size: int) -> None:
        w, idx = self._w, FIELDS
        w[idx["layout_version"].offset // 8] = LAYOUT_VERSION
        w[idx["total_size"].offset // 8] = size
        w[idx["supervisor_pid"].offset // 8] = os.getpid()
        w[idx["generation"].offset // 8] = 0
        _MEMBER_S.pack_into(self._buf, _MEMBER_BODY[0].offset,
                            Role.CANDIDATE, 0, NO_SLOT, NO_SLOT, NO_SLOT, 0, 0, 0)
        _LEDGER_S.pack_into(self._buf, _LEDGER_BODY[0].offset,
                            NO_INDEX, NO_INDEX, NO_INDEX, NO_INDEX, 0, NO_INDEX, 0, 0)
        _QUORUM_S.pack_into(self._buf, _QUORUM_BODY[0].offset, NO_INDEX, NO_INDEX)
        _SNAPSHOT_S.pack_into(self._buf, _SNAPSHOT_BODY[0].offset, NO_INDEX, NO_INDEX)
        w[idx["applied_index"].offset // 8] = NO_INDEX
        w[idx["repair_index"].offset // 8] = NO_INDEX
        w[idx["unchecked_end_index"].offset // 8] = NO_INDEX
        for p in range(PEER_RECORDS):  # every record, used or not yet: watermarks start at -1
            base = PEERS_OFFSET + p * PEER_STRIDE
            _PEER_S.pack_into(self._buf, base + _PEER_BODY[0].offset, NO_INDEX, NO_INDEX, 0, 0)
        # Everything else is zero from ftruncate. magic goes last: a reader that races creation
        # sees "not a state block" rather than half-initialised values.
        w[idx["magic"].offset // 8] = MAGIC

    @classmethod
    def attach(
        cls, name: str, *, role: str | None = None, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    ) -> SharedState:
        """Map an existing block (any role process), validating magic, version and size.

        Deliberately not ``SharedMemory(name)``: on 3.11 that registers the segment with the
        attaching process's resource tracker (gh-82300), which then unlinks it and prints a
        leak warning when this process exits -- destroying the node's block because one role
        restarted. Unregistering afterwards is no fix: processes started by multiprocessing
        share one tracker, and its set would lose the creator's registration. So we map the
        segment with the same primitives and never talk to the tracker.
        """
        check_platform()
        _validate_name(name)
        try:
            mm = _open_mapping(name, None)
        except FileNotFoundError:
            raise SegmentNotFound(
                f"no shared state block {name!r} (/dev/shm/{name}): the node's supervisor is not "
                "running, or it uses another group/node id/store dir"
            ) from None
        try:
            hdr = HeaderView(*_HEADER_S.unpack_from(mm, 0))
            problem = None
            if hdr.magic != MAGIC:
                problem = f"bad magic {hdr.magic:#x} (expected {MAGIC:#x})"
            elif hdr.layout_version != LAYOUT_VERSION:
                problem = f"layout version {hdr.layout_version}, this code reads {LAYOUT_VERSION}"
            elif not 1 <= hdr.n_peers <= min(PEER_RECORDS, (len(mm) - PEERS_OFFSET) // PEER_STRIDE):
                problem = f"n_peers {hdr.n_peers} does not fit a {len(mm)}-byte segment"
            elif hdr.total_size != layout_size(hdr.n_peers) or len(mm) < hdr.total_size:
                problem = (f"size mismatch: header says {hdr.total_size}, layout needs "
                           f"{layout_size(hdr.n_peers)}, segment has {len(mm)}")
            elif not 0 <= hdr.self_slot < hdr.n_peers:
                problem = f"self_slot {hdr.self_slot} outside 0..{hdr.n_peers - 1}"
            if problem is not None:
                raise LayoutMismatch(f"segment {name!r} is not a usable state block: {problem}")
            return cls(name, mm, owner=False, role=role, read_timeout_s=read_timeout_s)
        except BaseException:
            mm.close()
            raise

    def close(self) -> None:
        """Unmap (idempotent). Our views must be released before the mmap will close."""
        if self._mm is None:
            return
        self._w.release()
        self._buf.release()
        self._mm.close()
        self._mm = None

    def unlink(self) -> None:
        """Remove the segment's name (supervisor, at clean stop). Mappings stay valid."""
        _unlink_raw(self.name)
        if self._registered:  # once: the tracker must not unlink a successor's segment later
            resource_tracker.unregister("/" + self.name, "shared_memory")
            self._registered = False

    @property
    def closed(self) -> bool:
        return self._mm is None

    def __enter__(self) -> SharedState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Without this, interpreter exit could close the mmap while our cast view still exports
        # it and print "BufferError: cannot close exported pointers exist".
        try:
            self.close()
        except Exception:  # never raise from a finaliser
            pass

    # ---- header -----------------------------------------------------------------------------

    def header(self) -> HeaderView:
        """The header words (all written once at create, except pid and generation)."""
        return HeaderView(*_HEADER_S.unpack_from(self._buf, 0))

    def bump_generation(self) -> int:
        """Supervisor: count a role (re)start, so logs/tools can tell incarnations apart."""
        return self.incr("generation")

    # ---- single words -----------------------------------------------------------------------

    def _check_writer(self, writer: str, slot: int | None = None) -> None:
        if self._writer is None:
            return
        if writer != self._writer or (slot is not None and slot != self._writer_slot):
            owner = writer.replace("[p]", f"[{slot}]") if slot is not None else writer
            raise NotTheWriter(f"{self.role!r} may not write a field owned by {owner!r}")

    def get(self, name: str) -> int:
        """One field, one aligned load. Fine for any fixed field; a group needs read_*()."""
        return self._w[FIELDS[name].offset // 8]

    def set(self, name: str, value: int) -> None:
        """Store one lock-free word (counters, beats, supervisor_pid, generation)."""
        f = FIELDS[name]
        if f.group is not None or name in _IMMUTABLE:
            raise ValueError(f"{name!r} is {'in group ' + f.group if f.group else 'immutable'}; "
                             "use the group's write_*() method")
        self._check_writer(f.writer)
        self._w[f.offset // 8] = value

    def incr(self, name: str, delta: int = 1) -> int:
        """Add to a counter; a plain read-add-store is safe because the field has one writer."""
        f = FIELDS[name]
        if f.group is not None or name in _IMMUTABLE:
            raise ValueError(f"{name!r} is not a counter")
        self._check_writer(f.writer)
        i = f.offset // 8
        v = self._w[i] + delta
        self._w[i] = v
        return v

    def _bump_word(self, i: int, delta: int = 1) -> None:
        self._w[i] = self._w[i] + delta

    def word_writer(self, name: str) -> Callable[[int], None]:
        """A setter of lock-free word ``name`` with the writer checked once: for words stored on
        every loop turn (metrics gauges), where ``set``'s per-call lookups would show."""
        f = FIELDS[name]
        if f.group is not None or name in _IMMUTABLE:
            raise ValueError(f"{name!r} is not a lock-free word")
        self._check_writer(f.writer)
        return functools.partial(self._w.__setitem__, f.offset // 8)

    def set_peer(self, slot: int, name: str, value: int) -> None:
        """Store one of peer ``slot``'s lock-free words (dispatcher[slot] only)."""
        if PEER_FIELDS[name].group is not None:
            raise ValueError(f"{name!r} is in the peer group; use write_peer()")
        self._check_writer("dispatcher[p]", slot)
        self._w[self._peer_word_index(slot, name)] = value

    # ---- arrays: histograms and the request matrix -----------------------------------------

    def histogram_writer(self, name: str) -> HistogramWriter:
        """The hot-path observer of node histogram ``name`` (its writer role only)."""
        a = ARRAY_FIELDS[name]
        self._check_writer(a.writer)
        return HistogramWriter(self._w, a.offset // 8, HISTOGRAMS[name])

    def peer_histogram_writer(self, slot: int, name: str) -> HistogramWriter:
        """The observer of peer ``slot``'s histogram ``name`` (dispatcher[slot] only)."""
        a = PEER_ARRAY_FIELDS[name]
        self._check_writer("dispatcher[p]", slot)
        base = self._peer_word_index(slot, "seq") + a.offset // 8
        return HistogramWriter(self._w, base, HISTOGRAMS[name])

    def request_counter(self) -> request_counts.RequestCounter:
        """The handler's requests-by-type-and-code matrix (node/observe/request_counts.py)."""
        a = ARRAY_FIELDS["requests"]
        self._check_writer(a.writer)
        return request_counts.RequestCounter(self._w, a.offset // 8)

    def read_array(self, name: str) -> tuple[int, ...]:
        """Every word of array ``name`` (each word whole; the array is not one snapshot)."""
        a = ARRAY_FIELDS[name]
        i = a.offset // 8
        return tuple(self._w[i:i + a.count])

    def read_peer_array(self, slot: int, name: str) -> tuple[int, ...]:
        """Every word of peer ``slot``'s array ``name``."""
        a = PEER_ARRAY_FIELDS[name]
        i = self._peer_word_index(slot, "seq") + a.offset // 8
        return tuple(self._w[i:i + a.count])

    def read_histogram(self, name: str, slot: int | None = None) -> tuple[HistogramSpec, tuple[int, ...], int]:
        """(spec, per-bucket counts with +Inf last, sum) of a node histogram, or of peer
        ``slot``'s when a slot is given."""
        words = self.read_array(name) if slot is None else self.read_peer_array(slot, name)
        return HISTOGRAMS[name], words[:-1], words[-1]

    def _peer_word_index(self, slot: int, name: str) -> int:
        if not 0 <= slot < PEER_RECORDS:
            raise IndexError(f"peer slot {slot} outside 0..{PEER_RECORDS - 1}")
        return (PEERS_OFFSET + slot * PEER_STRIDE + PEER_FIELDS[name].offset) // 8

    def get_peer(self, slot: int, name: str) -> int:
        """One field of peer ``slot``'s record (one aligned load)."""
        return self._w[self._peer_word_index(slot, name)]

    def incr_peer(self, slot: int, name: str, delta: int = 1) -> int:
        """Add to one of peer ``slot``'s counters (dispatcher[slot] only)."""
        if PEER_FIELDS[name].group is not None:
            raise ValueError(f"{name!r} is in the peer group; use write_peer()")
        self._check_writer("dispatcher[p]", slot)
        i = self._peer_word_index(slot, name)
        v = self._w[i] + delta
        self._w[i] = v
        return v

    def _beat_index(self, role: str) -> tuple[int, str, int | None]:
        writer, slot = _parse_writer(role, self.n_peers, self.self_slot)
        if slot is not None:
            return self._peer_word_index(slot, "beat_ms"), writer, slot
        if role not in _BEAT_FIELD:
            raise ValueError(f"{role!r} has no beat word (the supervisor is the watchdog)")
        return FIELDS[_BEAT_FIELD[role]].offset // 8, writer, None

    def beat(self, role: str, now_ms: int | None = None) -> None:
        """Liveness word for the supervisor's watchdog, written by ``role`` itself."""
        i, writer, slot = self._beat_index(role)
        self._check_writer(writer, slot)
        self._w[i] = monotonic_ms() if now_ms is None else now_ms

    def last_beat(self, role: str) -> int:
        """When ``role`` last called :meth:`beat` (monotonic ms; 0 = never)."""
        return self._w[self._beat_index(role)[0]]

    # ---- seqlock machinery --------------------------------------------------------------------

    def _seq_begin(self, seq_idx: int) -> int:
        """Make the group's seq odd ("writing"); return the even value that ends the write.

        Used as ``end = self._seq_begin(i); try: <copy the body> finally: self._w[i] = end``
        (inlined rather than a context manager: it is on the hot path). Callers encode the body
        with ``Struct.pack`` *before* this, so a bad value raises while nothing has been
        touched -- ``pack_into`` would fail half way and the ``finally`` would then publish a
        half-written group as stable.
        """
        w = self._w
        s = w[seq_idx]
        if s & 1:  # a previous incarnation died mid-write: never publish its torn fields
            s += 1
        w[seq_idx] = s + 1
        return s + 2

    def _read_group(
        self, seq_idx: int, st: struct.Struct, offset: int, label: str, timeout_s: float | None
    ) -> tuple[int, ...]:
        w, buf = self._w, self._buf
        for _ in range(_SPIN_TRIES):
            s1 = w[seq_idx]
            if not s1 & 1:
                vals = st.unpack_from(buf, offset)
                if w[seq_idx] == s1:
                    return vals
            self.read_retries += 1
        # The writer is slow (descheduled) or dead: back off instead of burning a core.
        timeout = self.read_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        delay = 20e-6
        while True:
            s1 = w[seq_idx]
            if not s1 & 1:
                vals = st.unpack_from(buf, offset)
                if w[seq_idx] == s1:
                    return vals
            self.read_retries += 1
            if time.monotonic() >= deadline:
                raise SeqlockTimeout(
                    f"{self.name}: group {label!r} did not stabilise within {timeout:g} s "
                    f"(seq={s1}{', odd' if s1 & 1 else ''}): its writer probably died mid-write; "
                    "the restarted writer must call repair_seqs()"
                )
            time.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def _repair(self, seq_idx: int) -> bool:
        s = self._w[seq_idx]
        if s & 1:
            self._w[seq_idx] = s + 1
            return True
        return False

    def repair_seqs(self, role: str) -> list[str]:
        """A restarted ``role`` resets odd seq words of the groups it owns; returns their names.

        Call only once the previous incarnation is known dead (reaped by the supervisor), and
        rewrite the whole group right after: the interrupted write may have left it half done.
        """
        writer, slot = _parse_writer(role, self.n_peers, self.self_slot)
        self._check_writer(writer, slot)
        repaired = []
        if slot is not None:
            if self._repair(self._peer_word_index(slot, "seq")):
                repaired.append(f"peer[{slot}]")
            return repaired
        for group in _OWNED_GROUPS[writer]:
            if self._repair(FIELDS[_SEQ_OF_GROUP[group]].offset // 8):
                repaired.append(group)
        return repaired

    def _check_slot(self, what: str, slot: int) -> None:
        if not NO_SLOT <= slot < PEER_RECORDS:  # members added later hold slots past --peers
            raise ValueError(f"{what}={slot} is not a peer slot (-1..{PEER_RECORDS - 1})")

    # ---- member group (elector) ---------------------------------------------------------------

    def read_member(self, timeout_s: float | None = None) -> MemberView:
        """Consistent role/term/leader/... snapshot (raises SeqlockTimeout, never hangs)."""
        v = self._read_group(FIELDS["member_seq"].offset // 8, _MEMBER_S,
                             _MEMBER_BODY[0].offset, "member", timeout_s)
        return MemberView(Role(v[0]), *v[1:])

    def write_member(
        self,
        *,
        role: Role | None = None,
        current_term: int | None = None,
        leader_slot: int | None = None,
        voted_for_slot: int | None = None,
        transferee_slot: int | None = None,
        last_leader_heartbeat_ms: int | None = None,
        last_quorum_heartbeat_ms: int | None = None,
    ) -> MemberView:
        """Elector: publish the member group; omitted fields keep their value.

        ``role_epoch`` is not a parameter: it is bumped here whenever role or term changes, so
        every reader can detect "something changed since I looked" with one comparison.
        Reading our own fields without the seqlock is safe: nobody else writes them.
        """
        self._check_writer("elector")
        cur = _MEMBER_S.unpack_from(self._buf, _MEMBER_BODY[0].offset)
        new_role = Role(cur[0] if role is None else role)
        term = cur[1] if current_term is None else current_term
        leader = cur[2] if leader_slot is None else leader_slot
        voted = cur[3] if voted_for_slot is None else voted_for_slot
        transferee = cur[4] if transferee_slot is None else transferee_slot
        for what, s in (("leader_slot", leader), ("voted_for_slot", voted),
                        ("transferee_slot", transferee)):
            self._check_slot(what, s)
        epoch = cur[5] + (1 if (new_role != cur[0] or term != cur[1]) else 0)
        if new_role == Role.CANDIDATE and term > cur[1]:  # a vote round in a new term
            self._bump_word(FIELDS["elections_started"].offset // 8)
        if new_role == Role.LEADER and cur[0] != Role.LEADER:
            self._bump_word(FIELDS["elections_won"].offset // 8)
        if leader != cur[2] and leader != NO_SLOT:  # etcd's leader_changes_seen
            self._bump_word(FIELDS["leader_changes"].offset // 8)
            self._w[FIELDS["last_leader_change_ms"].offset // 8] = monotonic_ms()
        vals = (
            new_role, term, leader, voted, transferee, epoch,
            cur[6] if last_leader_heartbeat_ms is None else last_leader_heartbeat_ms,
            cur[7] if last_quorum_heartbeat_ms is None else last_quorum_heartbeat_ms,
        )
        seq_idx = FIELDS["member_seq"].offset // 8
        data = _MEMBER_S.pack(*vals)  # validate/encode before the seq goes odd
        off = _MEMBER_BODY[0].offset
        end = self._seq_begin(seq_idx)
        try:
            self._buf[off:off + len(data)] = data
        finally:
            self._w[seq_idx] = end
        return MemberView(*vals)

    # ---- ledger group (handler) ---------------------------------------------------------------

    def read_ledger(self, timeout_s: float | None = None) -> LedgerView:
        """Consistent begin/end/endTerm/committed snapshot."""
        return LedgerView(*self._read_group(FIELDS["ledger_seq"].offset // 8, _LEDGER5_S,
                                            _LEDGER_BODY[0].offset, "ledger", timeout_s))

    def read_ledger_config(self, timeout_s: float | None = None) -> tuple[LedgerView, ConfigWords]:
        """The ledger snapshot and the newest configuration's words, from ONE read of the
        group (the elector's and the ack checker's decisions count that configuration)."""
        vals = self._read_group(FIELDS["ledger_seq"].offset // 8, _LEDGER_S,
                                _LEDGER_BODY[0].offset, "ledger", timeout_s)
        return LedgerView(*vals[:5]), ConfigWords(*vals[5:])

    def write_ledger(
        self,
        *,
        ledger_begin_index: int | None = None,
        ledger_end_index: int | None = None,
        ledger_end_term: int | None = None,
        committed_index: int | None = None,
        store_generation: int | None = None,
        config_index: int | None = None,
        config_voters: int | None = None,
        config_learners: int | None = None,
    ) -> LedgerView:
        """Handler: publish the ledger group; omitted fields keep their value. The
        configuration words are written only when one is given (they rarely change: the
        handler passes them once after a change), so a plain publish costs what it did."""
        self._check_writer("handler")
        words = config_index is not None or config_voters is not None or config_learners is not None
        struct_ = _LEDGER_S if words else _LEDGER5_S
        cur = struct_.unpack_from(self._buf, _LEDGER_BODY[0].offset)
        vals = (
            cur[0] if ledger_begin_index is None else ledger_begin_index,
            cur[1] if ledger_end_index is None else ledger_end_index,
            cur[2] if ledger_end_term is None else ledger_end_term,
            cur[3] if committed_index is None else committed_index,
            cur[4] if store_generation is None else store_generation,
        )
        if words:
            vals += (cur[5] if config_index is None else config_index,
                     cur[6] if config_voters is None else config_voters,
                     cur[7] if config_learners is None else config_learners)
        seq_idx = FIELDS["ledger_seq"].offset // 8
        data = struct_.pack(*vals)
        off = _LEDGER_BODY[0].offset
        end = self._seq_begin(seq_idx)
        try:
            self._buf[off:off + len(data)] = data
        finally:
            self._w[seq_idx] = end
        return LedgerView(*vals[:5])

    # ---- quorum group (ack checker) -----------------------------------------------------------

    def read_quorum(self, timeout_s: float | None = None) -> QuorumView:
        """Consistent (quorum_index, quorum_term) pair."""
        return QuorumView(*self._read_group(FIELDS["quorum_seq"].offset // 8, _QUORUM_S,
                                            _QUORUM_BODY[0].offset, "quorum", timeout_s))

    def write_quorum(self, *, quorum_index: int, quorum_term: int) -> QuorumView:
        """Ack checker: publish the index a quorum has stored, with the term it was counted in."""
        self._check_writer("ack_checker")
        seq_idx = FIELDS["quorum_seq"].offset // 8
        data = _QUORUM_S.pack(quorum_index, quorum_term)
        off = _QUORUM_BODY[0].offset
        end = self._seq_begin(seq_idx)
        try:
            self._buf[off:off + len(data)] = data
        finally:
            self._w[seq_idx] = end
        return QuorumView(quorum_index, quorum_term)

    # ---- snapshot group (applier) -------------------------------------------------------------

    def read_snapshot(self, timeout_s: float | None = None) -> SnapshotView:
        """Consistent (snapshot_index, snapshot_term) of the newest snapshot (-1, -1: none)."""
        return SnapshotView(*self._read_group(FIELDS["snapshot_seq"].offset // 8, _SNAPSHOT_S,
                                              _SNAPSHOT_BODY[0].offset, "snapshot", timeout_s))

    def write_snapshot(self, *, snapshot_index: int, snapshot_term: int) -> SnapshotView:
        """Applier: publish the position of the newest snapshot on disk."""
        self._check_writer("applier")
        seq_idx = FIELDS["snapshot_seq"].offset // 8
        data = _SNAPSHOT_S.pack(snapshot_index, snapshot_term)
        off = _SNAPSHOT_BODY[0].offset
        end = self._seq_begin(seq_idx)
        try:
            self._buf[off:off + len(data)] = data
        finally:
            self._w[seq_idx] = end
        return SnapshotView(snapshot_index, snapshot_term)

    # ---- peer records (dispatcher[p]) ---------------------------------------------------------

    def read_peer(self, slot: int, timeout_s: float | None = None) -> PeerView:
        """Peer ``slot``'s consistent watermark plus its counters."""
        seq_idx = self._peer_word_index(slot, "seq")
        base = PEERS_OFFSET + slot * PEER_STRIDE
        v = self._read_group(seq_idx, _PEER_S, base + _PEER_BODY[0].offset, f"peer[{slot}]",
                             timeout_s)
        c = _PEER_WORDS_S.unpack_from(self._buf, base + _PEER_WORDS[0].offset)
        return PeerView(slot, v[0], v[1], bool(v[2]), v[3], *c)

    def read_peers(self, timeout_s: float | None = None, slots: Iterable[int] | None = None) -> list[PeerView]:
        """Every peer record except our own slot (which no dispatcher writes): those of
        `slots` (the slot table's held ones), or else the `--peers` slots."""
        wanted = range(self.n_peers) if slots is None else slots
        return [self.read_peer(p, timeout_s) for p in wanted if p != self.self_slot]

    def reset_peer(self, slot: int) -> None:
        """supervisor: clear a released slot's watermark (its dispatcher stopped: it had the
        record to itself), so the member the slot goes to next never inherits it."""
        self._check_writer("supervisor")
        if slot == self.self_slot:
            raise ValueError(f"slot {slot} is this node's own")
        seq_idx = self._peer_word_index(slot, "seq")
        off = PEERS_OFFSET + slot * PEER_STRIDE + _PEER_BODY[0].offset
        data = _PEER_S.pack(NO_INDEX, NO_INDEX, 0, 0)
        end = self._seq_begin(seq_idx)
        try:
            self._buf[off:off + len(data)] = data
        finally:
            self._w[seq_idx] = end

    def write_peer(
        self,
        slot: int,
        *,
        match_index: int | None = None,
        match_term: int | None = None,
        alive: bool | None = None,
        last_ack_ms: int | None = None,
    ) -> None:
        """dispatcher[slot]: publish the watermark; omitted fields keep their value.

        ``match_term`` is the leader term the watermark was earned in, so the ack checker can
        ignore watermarks left over from an earlier leadership.
        """
        self._check_writer("dispatcher[p]", slot)
        seq_idx = self._peer_word_index(slot, "seq")
        off = PEERS_OFFSET + slot * PEER_STRIDE + _PEER_BODY[0].offset
        cur = _PEER_S.unpack_from(self._buf, off)
        vals = (
            cur[0] if match_index is None else match_index,
            cur[1] if match_term is None else match_term,
            cur[2] if alive is None else int(alive),
            cur[3] if last_ack_ms is None else last_ack_ms,
        )
        data = _PEER_S.pack(*vals)
        end = self._seq_begin(seq_idx)
        try:
            self._buf[off:off + len(data)] = data
        finally:
            self._w[seq_idx] = end
