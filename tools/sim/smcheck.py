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

Installs (`--store segment`; docs/testing.md "Installs"). Retention deletes what the leader's
snapshots cover whatever a lagging follower still needs, so the leader's dispatcher streams that
follower its newest snapshot (node/core/install.py) in chunks of a size drawn per seed, through
every network and process fault plus faults aimed at the install in progress
(faults.py `Sim._install_frame`) and the lagging-follower shape (`Sim._lagging_install_shape`).
What is checked here besides the state itself (`on_reset`, `on_restore_installed`,
`on_install_done`, `_check_matches`):
- the snapshot a follower's applier installs, and the one its handler resets the log to, is a
  committed (index, term) of the group;
- the handler resets its log only when its applier has restored a state at or past the
  snapshot and a snapshot covering it is on its disk (so a crash right after the reset is
  safe), and after `reset_to(S, T)` the log is empty, begins at S + 1, ends and is committed
  at S, and its base's term is T;
- a follower the leader counts as installed holds (S, T) (its log begins right after S or has
  that entry);
- a leader never counts a follower of its term past what the follower's log holds (the match
  index the ack checker counts);
- liveness: convergence (every log equal to the leader's and applied) needs every lagging
  follower to have been installed and to have caught up.
`SimConfig.installs = False` (`--no-installs`) restores the simulator before installs:
`retention_floor` keeps retention below what every replica committed.
"""

from __future__ import annotations

import bisect
import io
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.membership import is_configuration_body
from node.statemachine import kv
from node.statemachine.api import CommittedEntry, StateMachine
from node.statemachine.loader import load_state_machine
from node.statemachine.snapshot_files import TMP_PREFIX
from node.statemachine.snapshot_meta import SNAPSHOTS_DIR, SnapshotError
from node.statemachine.snapshot_store import SnapshotStore
from node.store import codec
from node.store.base import StoreError

if TYPE_CHECKING:  # pragma: no cover
    from tools.sim.actors import ApplierActor
    from tools.sim.config import Node
    from tools.sim.world import Sim

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
    installed: int = -1  # highest snapshot index a leader installed on it (its applier restored)
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
        self.positions: list[tuple[str, int, int, str]] = []  # snapshot positions not committed yet
        self.config_at: list[int] = []  # indexes of the committed configuration entries
        self.config_seen = 0  # how much of the committed history config_at has looked at

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
        s, t = msg.last_index, msg.last_term
        if (s, t) == (-1, -1):
            return  # nothing applied there yet: nothing to snapshot
        self._committed_position(node, s, t, "a snapshot request was answered with")

    # ------------------------------------------------------------------ after every step
    def check(self) -> None:
        sim = self.sim
        if len(self.ref) < len(sim.chist):
            self.ref.extend(sim.chist)
            for i in [i for i in self.waiting if i < len(self.ref)]:
                for result, who in self.waiting.pop(i):
                    self.on_result(i, result, who)
            if self.positions:
                due, self.positions = self.positions, []
                for who, s, t, what in due:
                    self._committed_position(who, s, t, what)
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
            self._check_configuration(n)
        if sim.installs:
            self._check_matches()

    def _check_configuration(self, n: Node) -> None:
        """A node's handler never counts a configuration older than one it has committed: the
        newest configuration entry at or below its committed index is in force there, or a
        newer one (an installed snapshot that skipped the entry must carry it: docs/membership.md
        "Snapshots and installs carry the configuration")."""
        h = self.sim.chist
        while self.config_seen < len(h):
            if is_configuration_body(h[self.config_seen][1], h[self.config_seen][2]):
                self.config_at.append(self.config_seen)
            self.config_seen += 1
        a = n.roles.get("handler")
        if not n.up or n.store is None or a is None or not getattr(a, "opened", False) \
                or not getattr(a, "alive", True):
            return
        k = bisect.bisect_right(self.config_at, min(n.store.committed_index, len(h) - 1))
        if k and a.h.configs.latest.index < self.config_at[k - 1]:  # type: ignore[attr-defined]
            self.sim.fail(f"{n.id}: counts the configuration of entry {a.h.configs.latest.index} "  # type: ignore[attr-defined]
                          f"but has committed the configuration entry {self.config_at[k - 1]} "
                          f"(log {n.store.ledger_begin_index}..{n.store.ledger_end_index}, "
                          f"committed {n.store.committed_index})")

    def _check_applier(self, n: Node, a: ApplierActor, v: NodeView) -> None:
        ap = a.ap
        if a.inc != v.inc:  # a new incarnation: it restored a snapshot and replays
            v.inc, v.applied, v.max_applied, v.snap_seen = a.inc, None, -1, None
            self._check_no_leftovers(n)
        i = ap.applied
        if i < v.max_applied:
            self.sim.fail(f"{n.id}: applied index went back from {v.max_applied} to {i} in one applier incarnation")
        v.max_applied = i
        if i > max(v.max_committed, a.restored, v.installed):
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
                # (a snapshot a leader installed here may be past this node's committed index,
                # not past the group's)
                if final or s > max(v.max_committed, v.installed):
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

    # ------------------------------------------------------------------ install snapshot
    def _committed_position(self, who: str, s: int, t: int, what: str, final: bool = False) -> None:
        """(s, t) must be a committed entry. One beyond the history is looked at again when the
        history reaches it (a leader's applier follows the commit index its ack checker
        published, which the simulator reads from the stores a little later)."""
        h = self.sim.chist
        if s >= len(h) and not final:
            self.positions.append((who, s, t, what))
            return
        if not 0 <= s < len(h) or h[s][0] != t:
            self.sim.fail(f"{who}: {what} snapshot {s}/{t}, which is no committed entry (the history "
                          f"{'has term ' + str(h[s][0]) + ' there' if 0 <= s < len(h) else 'ends at ' + str(len(h) - 1)})")

    def on_reset(self, n: Node, store: Any, phase: str, s: int, t: int) -> None:
        """Around a follower handler's `reset_to(s, t)` (install snapshot). Before: its applier
        has restored a state at or past s and a snapshot covering s is on its disk -- so a
        crash right after the reset leaves a log that begins after a state a restart can
        restore. After: the log is empty and begins right after the snapshot, committed at it,
        and (s, t) is a committed entry of the group."""
        sim = self.sim
        if phase == "before":
            sim.stats["install_resets"] += 1
            self._committed_position(n.id, s, t, "resets its log to")
            a = n.roles.get("applier")
            if a is not None and a.alive and a.started and a.ap.applied < s:  # type: ignore[attr-defined]
                sim.fail(f"{n.id}: its handler resets the log to begin after snapshot {s}/{t} while its applier "
                         f"has applied only up to {a.ap.applied}: the log was reset before the "  # type: ignore[attr-defined]
                         f"applier restored the snapshot")
            on_disk = [x.last_index for x in SnapshotStore(n.cfg.store_dir, writable=False).list()]
            if max(on_disk, default=-1) < s:
                sim.fail(f"{n.id}: its handler resets the log to begin after snapshot {s}/{t}, but no snapshot "
                         f"on its disk covers {s} (newest {max(on_disk, default=-1)}): a crash now leaves a "
                         f"log that begins after a state nothing can restore")
            return
        got = (store.ledger_begin_index, store.ledger_end_index, store.committed_index)
        if got != (s + 1, s, s):
            sim.fail(f"{n.id}: after reset_to({s}, {t}) the log is begin {got[0]}, end {got[1]}, committed "
                     f"{got[2]}; it must begin right after the snapshot ({s + 1}), end and be committed at {s}")
        try:
            base = store.term_at(s)
        except StoreError as e:
            sim.fail(f"{n.id}: after reset_to({s}, {t}) the log base's term is unknown: {e}")
        if base != t:
            sim.fail(f"{n.id}: after reset_to({s}, {t}) the log base says term {base}")

    def on_restore_installed(self, n: Node, meta: Any) -> None:
        """The applier restored a snapshot a leader installed: it names a committed entry."""
        self.sim.stats["applier_installs"] += 1
        v = self.views[n.idx]
        v.installed = max(v.installed, meta.last_index)
        self._committed_position(n.id, meta.last_index, meta.last_term, "its applier installed")

    def on_install_done(self, leader: Node, f: Node, s: int, t: int) -> None:
        """The leader's dispatcher took the follower's `installed` for snapshot (s, t): the
        follower's log now holds (s, t) -- it begins right after it (reset), or it kept a log
        that has that entry, or it had committed past it -- whenever the follower is up in the
        leader's term (else its log is another leader's business)."""
        fs = f.store
        if fs is None or not f.up or f.block.member.current_term != leader.block.member.current_term:
            return
        why = ""
        if fs.ledger_end_index < s:
            why = f"its log ends at {fs.ledger_end_index}"
        elif fs.ledger_begin_index <= s:
            try:
                ft = fs.term_at(s)
            except StoreError as e:
                ft, why = -1, f"its entry there is unreadable: {e}"
            if not why and ft != t:
                why = f"its entry there is of term {ft}"
        if why:
            self.sim.fail(f"{f.id} answered {leader.id} that snapshot {s}/{t} is installed, but {why} "
                          f"(log {fs.ledger_begin_index}..{fs.ledger_end_index}, committed {fs.committed_index})")

    def _check_matches(self) -> None:
        """A leader's watermark for a follower in its own term (the block's peer match index,
        what the ack checker counts) never exceeds what that follower's log holds: an entry
        it stores with the leader's term, or one below its log's begin (covered by a snapshot,
        committed there). A leader that counted an installed follower past the snapshot's last
        entry could commit what only it holds."""
        sim = self.sim
        for n in sim.nodes:
            m = n.block.member
            ls = n.store
            if m.role != Role.LEADER or ls is None or not n.up:
                continue
            for p in n.block.peers:
                if p.slot == n.idx or p.match_term != m.current_term or p.match_index < 0:
                    continue
                f = sim.nodes[p.slot]
                fs = f.store
                if fs is None or not f.up or f.block.member.current_term != m.current_term:
                    continue  # down, or in another term (its log is another leader's business)
                mi = p.match_index
                why = ""
                if fs.ledger_end_index < mi:
                    why = f"its log ends at {fs.ledger_end_index}"
                elif fs.ledger_begin_index <= mi and ls.ledger_begin_index <= mi <= ls.ledger_end_index:
                    try:
                        ft, lt = fs.term_at(mi), ls.term_at(mi)
                    except StoreError:
                        continue
                    if ft != lt:
                        why = f"its entry there is of term {ft}, the leader's of term {lt}"
                if why:
                    sim.fail(f"{n.id} (leader, term {m.current_term}) counts {f.id} as holding its log up to "
                             f"{mi}, but {why} (begin {fs.ledger_begin_index})")

    # ------------------------------------------------------------------ retention, convergence
    def retention_floor(self) -> int:
        """With `SimConfig.installs` off (the simulator before installs; old seeds): the highest
        index the simulated retention may delete, one below what every replica has committed
        (a leader's COMPARE with a replica whose log ends at its committed index reads the
        term of that entry), so no replica ever needs an install."""
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
        for who, s, t, what in self.positions:
            self._committed_position(who, s, t, what, final=True)
        if self.waiting:
            i = min(self.waiting)
            self.sim.fail(f"a result for index {i} was returned but the group never committed it")
