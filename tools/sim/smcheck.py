"""State machines in the simulator (`--state-machine kv|chain`): the reference and its checks.

With a state machine every simulated node also runs the real applier (node/roles/applier.py,
driven by tools/sim/actors.ApplierActor) with a SnapshotStore in its store directory. This
module holds what the simulator knows that the nodes do not:

- the **reference**: a fresh instance of the same state machine applied to the group's
  committed history (`Sim.chist`) one entry at a time, keeping its state (its snapshot bytes:
  both state machines write canonical snapshots, so equal states are equal bytes) and its
  result after every index;
- the writers' KV commands (`command`), the reader's queries (`query_request`);
- the checks, after every step (`check`), on every client reply (`on_result`,
  `check_query`, `check_snapshot_reply`), at convergence (`converged`) and at the end
  (`final_check`). docs/testing.md, "State machines in the simulator", lists them.

Installs (a leader's snapshot streamed to a follower that needs entries retention deleted) are
not modelled yet; `retention_floor` is what keeps the simulated retention from creating such a
follower until they are.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.statemachine import kv
from node.statemachine.api import CommittedEntry, StateMachine
from node.statemachine.loader import load_state_machine
from node.statemachine.snapshot_files import TMP_PREFIX
from node.statemachine.snapshot_meta import SNAPSHOTS_DIR, SnapshotError
from node.statemachine.snapshot_store import SnapshotStore
from node.store import codec

if TYPE_CHECKING:  # pragma: no cover
    from tools.sim.actors import ApplierActor
    from tools.sim.world import Node, Sim

SPECS = {"kv": "kv", "chain": "tools.sim.chain:ChainStateMachine"}
KEYS = 8  # the writers' KV keyspace: small, so that CAS and DELETE meet existing keys


def state_bytes(sm: StateMachine) -> bytes:
    buf = io.BytesIO()
    sm.snapshot(buf)
    return buf.getvalue()


def describe(spec: str, state: bytes) -> str:
    """A short view of a state, for failure messages."""
    sm = load_state_machine(spec)
    try:
        sm.restore(io.BytesIO(state))
    except Exception as e:  # noqa: BLE001 - a failure message must not fail
        return f"<unrestorable: {e}>"
    if isinstance(sm, kv.KVStateMachine):
        keys = ", ".join(f"{x.key.decode()}@{x.mod_revision}" for x in sm.scan())
        return f"kv(last index {sm.last_index}, revision {sm.revision}, keys {keys or 'none'})"
    return f"chain(last index {sm.last_index}, {sm.count} applied, digest {sm.digest[:4].hex()})"


class Reference:
    """The state machine applied to the committed history: state and result after each index."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.sm = load_state_machine(spec)
        self.empty = state_bytes(self.sm)
        self.states: list[bytes] = []  # after applying entries 0..i
        self.results: list[bytes | None] = []  # None for NOOPs

    def __len__(self) -> int:
        return len(self.states)

    def extend(self, chist: list[tuple[int, int, bytes]]) -> None:
        for i in range(len(self.states), len(chist)):
            term, magic, body = chist[i]
            r = None
            if magic == codec.MAGIC_NORMAL:
                r = self.sm.apply([CommittedEntry(i, term, body)])[0]
            self.results.append(r)
            self.states.append(state_bytes(self.sm))

    def state(self, i: int) -> bytes:
        return self.empty if i < 0 else self.states[i]

    def machine(self, i: int) -> StateMachine:
        sm = load_state_machine(self.spec)
        sm.restore(io.BytesIO(self.state(i)))
        return sm


@dataclass
class NodeView:
    """What the checks remember about one node (across its restarts)."""

    inc: int = -1  # the applier incarnation looked at last
    applied: int | None = None  # its applied index when its state was last compared
    max_applied: int = -1  # highest applied index of that incarnation
    snap_seen: int | None = None  # its snapshot index when the disk was last listed
    max_committed: int = -1  # highest committed index of its store or block, ever
    newest_snapshot: int = -1  # newest snapshot index seen on its disk, ever
    begin: int = 0  # its store's ledger begin when last looked at
    checked: set[tuple[str, int]] = field(default_factory=set)  # (name, crc32c) of verified snapshots


class StateMachineChecks:
    def __init__(self, sim: Sim, kind: str) -> None:
        self.sim = sim
        self.kind = kind
        self.spec = SPECS[kind]
        self.ref = Reference(self.spec)
        self.views = [NodeView() for _ in sim.nodes]
        self.waiting: dict[int, list[tuple[bytes, str]]] = {}  # results for indexes not committed yet
        self.last_value: dict[bytes, bytes] = {}  # per key, the value a writer sent last

    # ------------------------------------------------------------------ what clients send
    def command(self, rng: Any, tag: bytes, pad: int) -> bytes:
        """An entry body. The chain state machine takes any bytes. For the KV store: a PUT,
        CAS (by value or by revision), DELETE, or a body that is no command at all (an
        UNKNOWN_OP result on every replica). All but DELETE carry the unique tag."""
        filler = tag + b"x" * pad
        if self.kind != "kv":
            return filler
        key = b"k%d" % rng.randrange(KEYS)
        r = rng.random()
        if r < 0.45:
            self.last_value[key] = filler
            return kv.encode_put(key, filler)
        if r < 0.6:
            expected = self.last_value.get(key) if rng.random() < 0.7 else None
            self.last_value[key] = tag
            return kv.encode_cas(key, expected, tag)
        if r < 0.7:
            cur = self.ref.sm.get(key)
            rev = cur.mod_revision if cur is not None and rng.random() < 0.7 else rng.randint(1, 50)
            self.last_value[key] = tag
            return kv.encode_cas_revision(key, rev, tag)
        if r < 0.85:
            return kv.encode_delete(key)
        return filler

    def query_request(self, rng: Any) -> bytes:
        if self.kind != "kv":
            return b"state"
        if rng.random() < 0.7:
            return kv.encode_get(b"k%d" % rng.randrange(KEYS))
        return kv.encode_scan(b"k", limit=rng.randint(1, KEYS + 1))

    # ------------------------------------------------------------------ client replies
    def on_result(self, index: int, result: bytes, who: str) -> None:
        """A SUCCESS reply carried `result` for the entry at `index`."""
        self.sim.stats["results_checked"] += 1
        if index >= len(self.ref):
            self.waiting.setdefault(index, []).append((result, who))
            return
        want = self.ref.results[index]
        if result != want:
            self.sim.fail(f"{who}: the append at {index} was answered with result {result[:24]!r}; the state "
                          f"machine applied to the committed history gives {want if want is None else want[:24]!r}")

    def check_query(self, request: bytes, msg: Any, acked_before: int, who: str) -> None:
        """A read of the state machine: its answer must be the reference's at the applied index
        it reports, and that index must cover every append acknowledged before the read was
        sent (linearizable reads, read-index)."""
        sim = self.sim
        sim.stats[f"query_{RC(msg.code).name.lower()}"] += 1
        if msg.code in (RC.UNSUPPORTED, RC.STATE_MACHINE_ERROR):
            sim.fail(f"{who}: query answered {RC(msg.code).name}: {getattr(msg, 'reason', '')}")
        if msg.code != RC.SUCCESS or not isinstance(msg, P.QueryResponse):
            return
        a = msg.applied_index
        if a < acked_before:
            sim.fail(f"{who}: stale read: a query answered at applied index {a} (by {msg.leader_id or '?'}, term "
                     f"{msg.term}) after index {acked_before} was acknowledged")
        if a >= len(self.ref):
            sim.fail(f"{who}: a query answered at applied index {a}, beyond the committed history ({len(self.ref) - 1})")
        want = self.ref.machine(a).query(request)
        if bytes(msg.answer) != want:
            sim.fail(f"{who}: query {request[:16]!r} at applied index {a} answered {bytes(msg.answer)[:40]!r}; the "
                     f"reference answers {want[:40]!r}")

    def check_snapshot_reply(self, msg: Any, node: str) -> None:
        """`dledger snapshot`: the position it reports must be a committed (index, term)."""
        if msg.code != RC.SUCCESS or not isinstance(msg, P.SnapshotResponse):
            return
        self.sim.stats["snapshot_requests_ok"] += 1
        h = self.sim.chist
        s, t = msg.last_index, msg.last_term
        if (s, t) == (-1, -1):
            return  # nothing applied there yet: nothing to snapshot
        if not 0 <= s < len(h) or h[s][0] != t:
            self.sim.fail(f"{node}: snapshot request answered ({s}, term {t}), which is no committed entry")

    # ------------------------------------------------------------------ after every step
    def check(self) -> None:
        sim = self.sim
        if len(self.ref) < len(sim.chist):
            self.ref.extend(sim.chist)
            for i in [i for i in self.waiting if i < len(self.ref)]:
                for result, who in self.waiting.pop(i):
                    self.on_result(i, result, who)
        for n in sim.nodes:
            v = self.views[n.idx]
            # what its store says, and what a handler published before dying (a restarted one
            # may recover a lower committed index from its checkpoint)
            v.max_committed = max(v.max_committed, n.block.ledger.committed_index,
                                  -1 if n.store is None else n.store.committed_index)
            a = n.roles.get("applier")
            if n.up and a is not None and a.alive and a.started:
                self._check_applier(n, a, v)  # type: ignore[arg-type]
            self._check_compaction(n, v)

    def _check_applier(self, n: Node, a: ApplierActor, v: NodeView) -> None:
        ap = a.ap
        if a.inc != v.inc:  # a new incarnation: it restored a snapshot and replays
            v.inc, v.applied, v.max_applied, v.snap_seen = a.inc, None, -1, None
            self._check_no_leftovers(n)
        i = ap.applied
        if i < v.max_applied:
            self.sim.fail(f"{n.id}: applied index went back from {v.max_applied} to {i} in one applier incarnation")
        v.max_applied = i
        if i > max(v.max_committed, a.restored):
            self.sim.fail(f"{n.id}: applied index {i} beyond its committed index {v.max_committed}")
        if i != v.applied and i < len(self.ref):
            # (i beyond the reference: the handler published i committed and died before the
            # simulator read its store; the history catches up later, and the next state is checked)
            got, want = state_bytes(ap.sm), self.ref.state(i)
            if got != want:
                self.sim.fail(f"{n.id}: state machine at applied index {i} is {describe(self.spec, got)}; the "
                              f"committed history up to {i} gives {describe(self.spec, want)}")
            v.applied = i
        if ap.snapshot_index != v.snap_seen and self.check_snapshots_on_disk(n):
            v.snap_seen = ap.snapshot_index

    def check_snapshots_on_disk(self, n: Node, final: bool = False) -> bool:
        """Every snapshot on the node's disk restores to the reference state at its index, and
        names a committed (index, term). False if one is beyond the history (yet: it is looked
        at again after the next step)."""
        v = self.views[n.idx]
        store = SnapshotStore(n.cfg.store_dir, writable=False)
        h = self.sim.chist
        done = True
        for snap in store.list():
            key = (snap.path.name, snap.meta.crc32c)
            if key in v.checked:
                continue
            s, t = snap.last_index, snap.last_term
            if s >= len(self.ref):
                if final or s > v.max_committed:
                    self.sim.fail(f"{n.id}: snapshot at index {s}, beyond the committed history ({len(h) - 1})")
                done = False
                continue
            v.checked.add(key)
            self.sim.stats["snapshots_verified"] += 1
            if h[s][0] != t:
                self.sim.fail(f"{n.id}: snapshot at index {s} says term {t}; the committed entry there is of term {h[s][0]}")
            sm = load_state_machine(self.spec)
            try:
                store.verify(snap)
                with store.open_data(snap) as f:
                    sm.restore(f)
            except (SnapshotError, ValueError, OSError) as e:
                self.sim.fail(f"{n.id}: snapshot {snap.path.name} does not restore: {e}")
            got, want = state_bytes(sm), self.ref.state(s)
            if got != want:
                self.sim.fail(f"{n.id}: snapshot {snap.path.name} restores to {describe(self.spec, got)}; the committed "
                              f"history up to {s} gives {describe(self.spec, want)}")
            v.newest_snapshot = max(v.newest_snapshot, s)
        return done

    def _check_no_leftovers(self, n: Node) -> None:
        """A (re)started applier's SnapshotStore removed what a take in progress left behind."""
        d = os.path.join(n.cfg.store_dir, SNAPSHOTS_DIR)
        left = sorted(x for x in os.listdir(d) if x.startswith(TMP_PREFIX)) if os.path.isdir(d) else []
        if left:
            self.sim.fail(f"{n.id}: the restarted applier left {left} in its snapshots directory")

    def _check_compaction(self, n: Node, v: NodeView) -> None:
        """Retention never deletes an entry after the newest snapshot on the node's disk."""
        s = n.store
        if s is None or s.ledger_begin_index <= 0:
            return
        if s.ledger_begin_index > v.begin:
            v.begin = s.ledger_begin_index
            self.sim.stats["retention_deletions"] += 1
        if s.ledger_begin_index > v.newest_snapshot + 1:
            # one taken by an applier that died before publishing it, or not verifiable yet
            self.check_snapshots_on_disk(n)
            on_disk = [x.last_index for x in SnapshotStore(n.cfg.store_dir, writable=False).list()]
            if s.ledger_begin_index > max([v.newest_snapshot, *on_disk]) + 1:
                self.sim.fail(f"{n.id}: retention deleted entries up to {s.ledger_begin_index - 1}, past the newest "
                              f"snapshot ({v.newest_snapshot}): a restart cannot rebuild the state")

    # ------------------------------------------------------------------ retention, convergence
    def retention_floor(self) -> int:
        """The highest index the simulated retention may delete: one below what every replica
        has committed (a leader's COMPARE with a replica whose log ends at its committed index
        reads the term of that entry). Without install-snapshot a replica that needs a deleted
        entry can never catch up (docs/operations.md); that shape is for the install tests."""
        return min(v.max_committed for v in self.views) - 1

    def converged(self, end: int) -> str | None:
        for n in self.sim.nodes:
            a = n.roles.get("applier")
            if a is None or not a.alive or not a.started:  # type: ignore[attr-defined]
                return f"{n.id}: applier not running"
            if a.ap.applied != end:  # type: ignore[attr-defined]
                return f"{n.id}: applied {a.ap.applied}, ledger end {end}"  # type: ignore[attr-defined]
        return None

    def final_check(self) -> None:
        self.check()
        for n in self.sim.nodes:
            self.check_snapshots_on_disk(n, final=True)
            self._check_compaction(n, self.views[n.idx])
        if self.waiting:
            i = min(self.waiting)
            self.sim.fail(f"a result for index {i} was returned but the group never committed it")
