"""The simulator's configuration and its model of a node: the fault names, `SimConfig` (one
seed's options), `Node` (what outlives a node's processes: its directory, disk, clock offset)
and `Violation`, the one exception an invariant check raises.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from node.config import NodeConfig

if TYPE_CHECKING:
    from tools.sim.actors import Actor
    from tools.sim.state import NodeBlock, SimLock
    from tools.sim.world import Sim

ALL_FAULTS = ("drop", "delay", "dup", "reorder", "partition", "crash", "role-crash", "pause", "truncate",
              "clock")
# Opt-in (not in the default set, so default seeds keep their histories):
# corrupt: flip a byte of a push (docs/contracts.md C12); eager-commit: leaders also send COMMIT
# pushes at any time, before COMPARE too (mutation t3-two-reads needs it: see
# DispatcherActor.eager_commit).
# disk-full: a node's appends fail with DiskFull for a while, and at the heal the leader's disk
# fills for 6 s: the group must fail over (docs/contracts.md C5).
# Session faults (each turns the writers' sessions on; see docs/testing.md "Client sessions"):
# session-evict: tiny session-table limits and short sessions; handler-restart: a leader's
# handler killed right after a stamped append reached it; disk-probe: a node's disk probe
# reads full for a while (appends refused before the session check); retention: (segment
# store) every disk reads above the clean ratio, so retention deletes old files under resends;
# bad-client: a writer that sends malformed and duplicated stamps, in MULTI frames.
SESSION_FAULTS = ("session-evict", "handler-restart", "disk-probe", "retention", "bad-client")
# figure8 (5 nodes): the history of Raft's Figure 8, where committing an old-term entry by
# counting replicas loses it (Sim._figure8_shape).
# membership: random single-server changes among the --peers members (tools/sim/membership.py).
# m2015-two-removes, m2015-add-remove (5 nodes), m2015-two-adds (6 nodes): the shapes of the
# 2015 single-server-change bug, once per seed (tools/sim/membership.py).
# join: one more machine, outside every --peers, joins with `server --join`; the membership
# changes add it, promote it and remove it, and each node's supervisor starts and stops its
# dispatchers (Sim.follow_slots). Implies membership changes.
# rot: (segment store) damage at rest: a crashed node comes back with one bit of a checkpointed
# entry flipped (its committed entry C, or one above it up to the checkpoint's end), one node
# at a time; it must repair from its peers (actors.rot_entry). rot-below: the same below C,
# which open leaves to the scrub (found later, while the node may vote or lead).
# lost-disk: a crashed node comes back with an empty store directory (no log, no currterm), one
# node at a time: its elector asks the members' handlers for their term (METADATA, through the
# simulated network) and decides by node/core/lost_state.py, then catches up before it votes
# freely (docs/election.md "Non-voting members").
OPT_IN_FAULTS = ("corrupt", "eager-commit", "disk-full", "figure8", "membership", "m2015-two-removes",
                 "m2015-add-remove", "m2015-two-adds", "join", "rot", "rot-below", "lost-disk") + SESSION_FAULTS
TRACE_LEN = 60
RETENTION_RATIO = 0.87  # --state-machine --store segment: the disk every handler measures (clean < it < full)
FAILOVER_MS = 4000  # disk-full: an append must be acknowledged in the last half of this after the fill
CLIENT = -1  # node index of the clients' side of a link


class Violation(BaseException):  # noqa: N818 - BaseException: role code must never swallow it
    """An invariant does not hold."""


class _SimNodeConfig(NodeConfig):
    """NodeConfig with the parsed peer list cached (roles read it on hot paths)."""

    @functools.cached_property
    def peer_map(self) -> dict[str, tuple[str, int]]:  # type: ignore[override]
        return NodeConfig.peer_map.fget(self)  # type: ignore[attr-defined]

    @functools.cached_property
    def peer_ids(self) -> list[str]:  # type: ignore[override]
        return list(self.peer_map)


@dataclass
class SimConfig:
    seed: int = 0
    nodes: int = 3
    faults: tuple[str, ...] = ALL_FAULTS
    steps: int = 500
    store: str = "memory"
    writers: int = 2
    trace_len: int = TRACE_LEN
    hash_trace: bool = False
    heal_ms: int = 20_000  # after the fault phase: time allowed to converge
    preempt: float = 0.25  # probability that a block read is a preemption point that runs others
    max_depth: int = 3
    tmp_root: str | None = None
    sessions: bool = False  # about half the writers use client sessions and resend (exactly-once)
    state_machine: str = ""  # "kv" or "chain": every node runs an applier (tools/sim/smcheck.py)
    installs: bool = True  # with a state machine and the segment store: retention may strand a
    # lagging follower, which the leader then sends its snapshot (False: the old retention floor)


@dataclass
class Node:
    sim: Sim
    idx: int
    id: str
    cfg: NodeConfig
    dir: str
    block: NodeBlock = None  # type: ignore[assignment]
    lock: SimLock = None  # type: ignore[assignment]
    clock_offset: int = 0
    disk_full_until: int = 0  # fault disk-full: its store's appends fail until then
    probe_full_until: int = 0  # fault disk-probe: its disk measurement reads full until then
    answers_lost_until: int = 0  # fault disk-probe: its answers to clients are lost until then
    max_committed: int = -1  # the highest committed index its store or block ever showed
    up: bool = True
    memstore: Any = None  # the memory store outlives handler crashes (it stands for the disk)
    store: Any = None  # the handler's open store, for the invariant checks
    checked: int = -1  # committed entries of this node compared with the history so far
    max_term: int = -1  # highest term its elector ever published (across restarts)
    last_wrote: tuple[int, int] = (0, 0)
    roles: dict[str, Actor] = field(default_factory=dict)  # this life's (Sim._start_node starts anew)
    life: int = 0  # how many times the node has started: a role restart belongs to one life
    slot_file: Any = None  # fault join: the node's slot table (node.wiring.slot_file)
    slots_seen: Any = None  # Sim.follow_slots: the inputs of its last pass on this node
    slots_key: Any = None  # ... and the cheap key that says whether any of them moved

    def clock(self) -> int:
        return self.sim.now + self.clock_offset
