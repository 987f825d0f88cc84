"""Fault injection: role and node crashes, pauses, and the fault schedule with its multi-step
shapes (a truncated old leader, a lagging follower, Figure 8, an install cut short, a full
disk), plus the heal that ends the fault phase.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import Role
from node.wiring.slot_file import LOCK_FILE as SLOTS_LOCK_FILE
from node.wiring.slot_file import SLOTS_FILE
from tools.sim import actors as A
from tools.sim.clients import ClientActor
from tools.sim.state import SimLock

if TYPE_CHECKING:
    from tools.sim.config import Node



def _majority_without(voters, node_id: str) -> bool:  # noqa: ANN001 - a configuration's voters
    """Whether `voters` other than `node_id` are a majority of `voters`: the group can elect
    and commit without that node."""
    return len(voters) - (node_id in voters) >= len(voters) // 2 + 1

class FaultsMixin:
    """`Sim`'s faults: needs `rng`, `now`, `faults`, `faulting`, `nodes`, the scheduler and the
    network."""

    def _restart_role(self, n: Node, key: str, life: int) -> None:
        """The supervisor restarts a crashed role -- the supervisor of the life it crashed in:
        after a whole-node restart the new one starts what its own plan says."""
        old = self.actor(key)
        if old is None or old.alive or not n.up or n.life != life:
            return
        cls = type(old)
        if cls is A.DispatcherActor:
            if old.retired:  # type: ignore[attr-defined]
                return  # its member left: the supervisor stopped it for good
            new: A.Actor = A.DispatcherActor(self, n, old.peer, old.slot if old.address else None,  # type: ignore[attr-defined]
                                             old.address)  # type: ignore[attr-defined]
        else:
            new = cls(self, n)  # type: ignore[call-arg]
        self._add_actor(new)
        self.trace_event(key, "restart", "")

    def kill_actor(self, a: A.Actor, why: str) -> None:
        if not a.alive:
            return
        a.kill()
        self.trace_event(a.key, "crash", why)
        self.stats["role_crashes"] += 1
        n = a.node
        if n is not None and n.up:
            delay = self.rng.randint(5, 400)
            life = n.life
            self.schedule(self.now + delay, "call", lambda: self._restart_role(n, a.key, life))

    def pause_actor(self, a: A.Actor, ms: int) -> None:
        """SIGSTOP: the process runs nothing (its inputs queue up) until SIGCONT."""
        if not a.alive:
            return
        a.listening = False
        a.paused = True
        a.wake_at = max(a.wake_at, self.now + ms)
        self.trace_event(a.key, "pause", f"{ms} ms")

        def resume() -> None:
            if a.alive and a.paused:
                self.resume_actor(a)

        self.schedule(self.now + ms, "call", resume)

    def resume_actor(self, a: A.Actor) -> None:
        """SIGCONT."""
        a.paused = False
        a.listening = getattr(a, "started", True)
        a.wake_at = min(a.wake_at, self.now)
        self.trace_event(a.key, "resume", "")

    def crash_node(self, n: Node, torn: bool, down_ms: int | None = None, lost_disk: bool = False) -> None:
        if not n.up:
            return
        for a in list(n.roles.values()):
            if a.alive:
                a.kill()
        n.up = False
        n.lock = SimLock(self, n)
        what = ""
        if lost_disk:
            self._lose_disk(n)
            what = " lost its disk"
            torn = False
        if torn and self.store_kind == "segment":
            what = " torn tail: " + A.write_torn_tail(n, self.rng)
        rots = [k for k in ("rot", "rot-below") if k in self.faults]
        if (rots and self.store_kind == "segment" and self._may_rot() and self._others_elect_without(n)
                and not self._catching_up(n)):
            kind = rots[0] if len(rots) == 1 else self.rng.choice(rots)
            held = max((m.block.ledger.ledger_begin_index for m in self.nodes
                        if m is not n and m.block is not None), default=0)
            rot = A.rot_entry(n, self.rng, below=kind == "rot-below", held_from=held)
            if rot is not None:
                self.rot_pending = (n, rot[0])
                self.stats["rot"] += 1
                what += " rot: " + rot[1]
        self.trace_event(n.id, "crash", "node" + what)
        self.stats["node_crashes"] += 1
        if down_ms is None:
            down_ms = self.rng.randint(50, 2500)
        self.schedule(self.now + down_ms, "call", lambda: self.restart_node(n))

    def _others_elect_without(self, n: Node) -> bool:
        """Whether the other voters of every live handler's latest configuration are a majority
        of it without `n`. A node repairing does not vote (by design: it may have been one of
        the majority that committed what it lost), so damaging a voter the others cannot elect
        without -- one of two voters after a `membership` fault removed the third (seed
        975,057) -- leaves the group rightly without a leader, as a one-member group has no
        peer to repair from."""
        # The newest configuration any handler holds (the crashing node's too: its actors are
        # dead, their state is still there), committed or not: what the group may count with.
        latest = None
        for m in self.nodes:
            h = m.roles.get("handler")
            if h is None or not getattr(h, "opened", False):
                continue
            c = h.h.configs.latest  # type: ignore[attr-defined]
            if latest is None or c.index > latest.index:
                latest = c
        if latest is None:
            return True
        return _majority_without(latest.voters, n.id)

    def _catching_up(self, n: Node) -> bool:
        """Whether a node other than `n` has lost term/vote state or is catching up after a lost
        disk or a late first start (fault lost-disk): it votes only for a log that reaches what
        the group had, so damaging `n` too is a second failure at once (seed 30,683: the only
        full log was the one rot damaged, and no other log reached the late member's floor)."""
        return any(m is not n and m.up and m.block is not None and m.block.words.get("not_voting", 0) in (2, 3)
                   for m in self.nodes)

    def _lose_disk(self, n: Node) -> None:
        """Fault lost-disk: every file of the node's store directory gone (its log, checkpoint,
        currterm; the memory store's contents), as a replaced disk leaves it. What the checks
        remember of its old disk goes too: its term may go back to the group's, and its
        committed entries are checked again as it fetches them."""
        n.memstore = None
        for p in os.listdir(n.dir):
            if p in (SLOTS_FILE, SLOTS_LOCK_FILE):
                continue  # the run directory's (a node's is not on its store's disk)
            full = os.path.join(n.dir, p)
            shutil.rmtree(full) if os.path.isdir(full) and not os.path.islink(full) else os.unlink(full)
        n.checked = n.max_committed = n.max_term = -1
        n.last_wrote = (0, 0)
        self.lost_disk_pending = n
        self.stats["lost_disks"] += 1

    def _lost_disk_done(self) -> bool:
        """The node that lost its disk learned the group's term and caught up (its elector
        votes freely again), so another disk may go."""
        n = self.lost_disk_pending
        if n is None:
            return True
        e = self._node_actor(n, "elector")
        if e is None or not e.started or e.e.termvote.current.catch_up >= 0:  # type: ignore[attr-defined]
            return False
        self.lost_disk_pending = None
        self.stats["lost_disks_caught_up"] += 1
        return True

    def _may_lose_disk(self, n: Node) -> bool:
        """One failure at a time, as the design assumes (docs/election.md: the lost-state rule is
        wrong only after a lost disk together with the loss of every member that saw the
        history): no other lost disk still catching up, no damaged node repairing, and the
        other voters elect without it."""
        if not self._lost_disk_done() or self.rot_pending is not None:
            return False
        if any(getattr(m.store, "repair_index", -1) >= 0 for m in self.nodes):
            return False
        return self._others_elect_without(n)

    def _may_rot(self) -> bool:
        """Fault `rot` damages one node at a time: the group holds every entry on a majority,
        and two damaged copies of one entry in a 3-node group would leave it without a voter
        that may elect a leader (by design: a node repairing does not vote). A damaged node is
        done once it has reopened its store, repaired, and scrubbed what open left unchecked."""
        if not self._lost_disk_done():
            return False
        if self.rot_pending is None:
            return True
        n, _i = self.rot_pending
        h = self._node_actor(n, "handler")
        st = h.h.store if h is not None and h.opened else None
        if st is None or st.repair_index >= 0 or st.unchecked_end >= 0:  # repairing, or not scrubbed
            return False
        self.rot_pending = None
        self.stats["rot_repaired"] += 1
        return True

    def restart_node(self, n: Node) -> None:
        if n.up:
            return
        self.trace_event(n.id, "restart", "node")
        self._start_node(n)

    def _install_frame(self, n: Node, dst: Node, src: A.Actor, frame: bytes) -> None:
        """An INSTALL chunk leaving a leader's dispatcher: counted, and (while faulting, with
        the seed's `p_install_fault`) the cue for a fault aimed at the install in progress: kill
        the follower's applier or handler, the leader's dispatcher, or the whole leader or
        follower node; pause the follower's applier; or cut the leader off (a new leader
        takes over mid-install), 0-30 ms after the chunk left."""
        hdr = P.peek_header(frame)
        if hdr is None or hdr[1] != P.MsgType.INSTALL:
            return
        msg = P.decode(frame)
        self.stats["install_chunks_sent" if len(msg.data) else "install_probes_sent"] += 1
        r = self.rng
        if not self.faulting or r.random() >= self.p_install_fault:
            return
        what = r.choice(self.install_faults)
        self.stats["install_faults"] += 1

        def strike() -> None:
            if not self.faulting:
                return
            self.trace_event("sim", "install-fault", f"{what} (install {n.id} -> {dst.id})")
            if what == "follower-applier" and (a := self._node_actor(dst, "applier")) is not None:
                self.kill_actor(a, "install fault")
            elif what == "follower-handler" and (a := self._node_actor(dst, "handler")) is not None:
                self.kill_actor(a, "install fault")
            elif what == "leader-dispatcher" and src.alive:
                self.kill_actor(src, "install fault")
            elif what == "follower-node":
                self.crash_node(dst, torn=r.random() < 0.5)
            elif what == "leader-node":
                self.crash_node(n, torn=r.random() < 0.5)
            elif what == "pause-applier" and (a := self._node_actor(dst, "applier")) is not None:
                self.pause_actor(a, r.choice((100, 300, 1000, 3000)))
            elif what == "new-leader":
                self._cut(self._isolate([n.idx]), f"isolate installing leader {n.id}", r.randint(500, 3000))

        self.schedule(self.now + r.randint(0, 30), "call", strike)

    def _corrupt_push(self, payload: tuple[bytes, bytes], src_key: str) -> tuple[bytes, bytes]:
        """Fault `corrupt`: flip one byte of the entries a push carries, between nodes (a bad
        NIC, memory or disk on the leader; docs/contracts.md C12). Clients' bytes are never touched: the
        history check must know what was written."""
        ident, frame = payload
        msg = P.decode(frame)
        if isinstance(msg, P.InstallRequest) and len(msg.data):
            # a chunk of the leader's snapshot: only the follower's whole-file checksum can tell
            data = bytearray(msg.data)
            at = self.rng.randrange(len(data))
            data[at] ^= 1 << self.rng.randrange(8)
            msg.data = bytes(data)
            self.trace_event(src_key, "corrupt", f"install chunk at {msg.offset} byte {at}")
            self.stats["install_chunks_corrupted"] += 1
            return ident, P.encode(msg)
        if not isinstance(msg, P.PushRequest) or msg.kind != P.PushKind.APPEND or not msg.entries:
            return payload
        blob = bytearray(msg.entries)
        at = self.rng.randrange(len(blob))
        blob[at] ^= 1 << self.rng.randrange(8)
        msg.entries = bytes(blob)
        self.trace_event(src_key, "corrupt", f"push {msg.first_index}+{msg.count} byte {at}")
        return ident, P.encode(msg)

    def _inject_fault(self) -> None:
        r = self.rng
        self.next_fault = self.now + r.randint(*self.fault_every)
        if self.now < self.quiet_until:
            return  # a multi-step fault shape is playing out
        if self.m15 is None and any(f.startswith("m2015-") for f in self.faults) \
                and not self.stats["m2015_shapes"]:
            self.m15_start()  # once per seed (tools/sim/membership.py)
            return
        kinds = [k for k in ("partition", "crash", "role-crash", "pause", "truncate", "clock") if k in self.faults]
        if "eager-commit" in self.faults:
            kinds.append("lagging-follower")
        if "disk-full" in self.faults:
            kinds.append("disk-full")
        if ("rot" in self.faults or "rot-below" in self.faults) and self.store_kind == "segment" \
                and "crash" in self.faults:
            kinds += ["crash"] * 2  # each crash may bring damage at rest back with it
        if "disk-probe" in self.faults:
            kinds += ["disk-probe"] * 4  # a seed's fault phase is short: drawn often
        if "figure8" in self.faults and self.cfg.nodes == 5:
            kinds += ["figure8"] * 4
        if self.smc is not None and "role-crash" in self.faults:
            kinds.append("applier-crash")  # its restart restores a snapshot and replays: often
        if self.installs and ("partition" in self.faults or "crash" in self.faults):
            kinds += ["lagging-install", "lagging-install"]
        if "membership" in self.faults or "join" in self.faults:
            kinds += ["membership"] * 3
        if "lost-disk" in self.faults and self.smc is None:
            kinds += ["lost-disk"] * 2
        if not kinds:
            return
        k = r.choice(kinds)
        n = r.choice(self.nodes)
        if k == "partition":
            others = [m.idx for m in self.nodes if m is not n]
            if r.random() < 0.5:
                cut = [(n.idx, o) for o in others] + [(o, n.idx) for o in others]
                desc = f"isolate {n.id}"
            elif r.random() < 0.5:
                o = r.choice(others)
                cut = [(n.idx, o)]
                desc = f"one-way {n.id}->n{o}"
            else:
                side = set(r.sample(others, r.randint(1, max(1, len(others) // 2))))
                cut = [(a, b) for a in side for b in others + [n.idx] if b not in side]
                cut += [(b, a) for a, b in cut]
                desc = f"split {sorted(side)}"
            self._cut(cut, desc, r.randint(100, 3000))
        elif k == "crash":
            if n.up:
                self.crash_node(n, torn=r.random() < 0.5)
        elif k == "lost-disk":
            if n.up and self._may_lose_disk(n):
                # Down longer than a vote round: a vote it cast for a candidate whose round is
                # still open is what the lost-state rule leaves to time (node/core/lost_state.py).
                self.crash_node(n, torn=False, down_ms=r.randint(1000, 3000), lost_disk=True)
        elif k == "role-crash":
            if n.up:
                a = r.choice(list(n.roles.values()))
                self.kill_actor(a, "between steps")
        elif k == "applier-crash":
            a = self._node_actor(n, "applier")
            if n.up and a is not None:
                self.kill_actor(a, "applier crash")
        elif k == "pause":
            if n.up:
                self.pause_actor(r.choice(list(n.roles.values())), r.choice((100, 300, 1000, 3000, 6000)))
        elif k == "truncate":
            self._truncate_shape()
        elif k == "lagging-follower":
            self._lagging_follower_shape()
        elif k == "lagging-install":
            self._lagging_install_shape()
        elif k == "figure8":
            self._figure8_shape()
        elif k == "disk-full":
            ms = r.randint(100, 3000)
            n.disk_full_until = self.now + ms
            self.trace_event(n.id, "disk-full", f"for {ms} ms")
        elif k == "disk-probe":
            lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
            ms = r.randint(100, 4000)
            if lead and r.random() < 0.7:
                # Mostly the leader, and its answers to clients are lost for a moment as the
                # disk fills (a broken connection): the resends of appends it stored meet
                # DISK_FULL (the handler measures the disk once a second)
                n = lead[0]
                ms = r.randint(1500, 5000)
                lost = r.randint(200, 1500)
                n.answers_lost_until = self.now + lost
                self.trace_event(n.id, "answers-lost", f"for {lost} ms")
            n.probe_full_until = self.now + ms
            self.stats["disk_probe_full"] += 1
            self.trace_event(n.id, "disk-probe", f"reads full for {ms} ms")
        elif k == "membership":
            self.membership_fault()
        elif k == "clock":
            j = r.randint(1, 150)
            n.clock_offset += j
            self.trace_event(n.id, "clock", f"+{j} ms")

    def _truncate_shape(self) -> None:
        """A deposed leader's uncommitted tail gets truncated (segment files deleted and
        re-created) and that node leads again while a peer still holds the old tail -- the
        shape that broke the generation fence (docs/contracts.md C1): cut the leader X off with one
        follower Z while clients write to X; rejoin X (it follows the new leader and truncates) but
        keep Z away; then cut the new leader off so X may win; finally bring Z back."""
        r = self.rng
        lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
        if not lead:
            return
        x = lead[0]
        z = r.choice([m for m in self.nodes if m is not x])
        t1 = r.randint(2000, 4000)
        self._cut(self._isolate([x.idx, z.idx]), f"isolate old leader {x.id} with {z.id}", t1)
        t2 = t1 + r.randint(3000, 6000)
        self.quiet_until = self.now + t2

        def rejoin() -> None:
            if not self.faulting:
                return  # the heal came first
            self._cut(self._isolate([z.idx]), f"keep {z.id} away", t2 - t1)
            self.writing = False  # writers pause: the new leader's log stays short of X's old tail
            self.trace_event("sim", "writers", "pause")

        def resume() -> None:
            if self.faulting:
                self.writing = True
                self.trace_event("sim", "writers", "resume")

        self.schedule(self.now + t1, "call", rejoin)
        self.schedule(self.now + t2, "call", resume)

        def depose() -> None:
            now_lead = [m for m in self.nodes if m.up and m is not x and m.block.member.role == Role.LEADER]
            if now_lead:
                self._cut(self._isolate([now_lead[0].idx]), f"isolate new leader {now_lead[0].id}",
                          r.randint(1500, 3000))

        self.schedule(self.now + t1 + r.randint(200, 1000), "call", depose)

    def _fill_leaders_disk(self) -> int | None:
        """Fault `disk-full`, at the heal (docs/contracts.md C5): the leader's disk fills for 6 s
        while the others are healthy and clients keep writing. A leader that cannot write must step
        down so that the group fails over: some append must be acknowledged again within FAILOVER_MS
        (checked in `run`). Returns when the disk filled (None: no leader now, or a node damaged
        by fault rot is not repaired yet, or another node does not vote freely -- it is
        catching up after a lost disk or a late first start (fault lost-disk) --, or the
        leader's configuration has too few other voters to make a majority without it -- a
        `membership` heal that has not restored every member yet: not "the others healthy", and
        with the leader unable to write, the group may rightly have no node that can lead until
        the disk frees)."""
        lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
        if not lead or not self._may_rot():
            return None
        if any(m.block is not None and m.block.words.get("not_voting", 0) for m in self.nodes if m.up):
            return None
        n = lead[0]
        h = self._node_actor(n, "handler")
        if h is None or not getattr(h, "opened", False):
            return None
        if not _majority_without(h.h.configs.latest.voters, n.id):  # type: ignore[attr-defined]
            return None
        n.disk_full_until = self.now + 6000
        self.trace_event(n.id, "disk-full", "leader's disk full for 6000 ms")
        return self.now

    def _lagging_follower_shape(self) -> None:
        """A follower that learns of a new leader late (part of fault `eager-commit`, the shape
        mutation t3-two-reads needs, docs/contracts.md C2): cut the leader X off with one follower Z
        while clients write to X (Z stores X's tail, which cannot commit), and stall Z's elector
        (SIGSTOP) for as long; the rest (5 nodes) elect a new leader that commits over X's tail. The
        cut heals a little before Z's elector resumes, so the new leader's pushes -- a COMMIT first,
        with eager-commit -- reach Z's handler while Z's block still says FOLLOWER of X, and Z's
        elector switches to the new leader while the handler is deciding one of them."""
        r = self.rng
        lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
        if not lead:
            return
        x = lead[0]
        zs = [m for m in self.nodes if m is not x and m.up and self._node_actor(m, "elector") is not None]
        if not zs:
            return
        z = r.choice(zs)
        t1 = r.randint(2500, 5000)
        until = self.now + t1 + r.randint(250, 700)  # both resume after 1-3 heartbeats queued
        self._cut(self._isolate([x.idx, z.idx]), f"isolate leader {x.id} with {z.id}", t1)
        self.pause_actor(z.roles["elector"], until - self.now)

        healed = self.now + t1

        def stall_handler() -> None:
            # After X's last pushes (its lease is gone), the handler queues the new leader's
            # pushes while the elector queues its heartbeats, and both resume at once. X is cut
            # off from Z too: its candidacy would otherwise reach Z's elector first.
            h = self._node_actor(z, "handler")
            if h is not None and until > self.now and self.faulting:
                self.pause_actor(h, until - self.now)
            if healed > self.now:
                self._cut([(x.idx, z.idx), (z.idx, x.idx)], f"cut {x.id} from {z.id}", healed - self.now)

        self.schedule(self.now + r.randint(500, 900), "call", stall_handler)
        self.quiet_until = until + 500

    def _figure8_shape(self) -> None:
        """Raft's Figure 8 (5 nodes; fault figure8), in four steps driven by role changes:
        1. cut the leader X off with one follower Y while the writers write to X: a tail of X's
           term on X and Y only;
        2. the first leader Z the other three elect is cut off the moment it is elected: its
           term's NOOP stays on Z alone (its last term is now the highest);
        3. 200-800 ms later X and Y rejoin the two others (Z stays away) and one of X, Y leads
           again, catching the others up entry by entry (one entry per push in this fault);
        4. 3-15 ms after that leader first publishes a quorum index above what any node has
           committed, its node crashes (down
           4-6 s), the two others' handlers too (what was in flight to them is lost; they
           restart at once), the other of X, Y is cut off and Z comes back: Z, whose last term is higher
           than that of X's tail, can win the two others' votes and overwrite the tail on
           them. Safe only if the leader of step 3 committed nothing of X's old tail before
           its own NOOP was on a majority (Raft §5.4.2; mutation `old-term-commit`)."""
        lead = [m for m in self.nodes if m.up and m.block.member.role == Role.LEADER]
        if not lead or self.f8 is not None or any(not m.up for m in self.nodes):
            return
        r = self.rng
        x = lead[0]
        y = r.choice([m for m in self.nodes if m is not x])
        links = self._isolate([x.idx, y.idx])
        self.blocked.update(links)
        self.f8 = dict(phase="cut", x=x.idx, y=y.idx, term=x.block.member.current_term, links=links)
        self.stats["figure8_shapes"] += 1
        self.trace_event("net", "cut", f"figure8: isolate leader {x.id} with {y.id}")
        for a in self.actors:  # the writers write to X while its lease lasts: its tail
            if isinstance(a, ClientActor):
                a.w.target = x.idx
        self.quiet_until = self.now + 15_000
        f8 = self.f8

        def abort() -> None:
            if self.f8 is f8:
                self._figure8_end(f"figure8: gave up in phase {f8['phase']}")

        self.schedule(self.now + 14_000, "call", abort)

    def _figure8_end(self, why: str) -> None:
        f8, self.f8 = self.f8, None
        if f8 is not None:
            self.stats[f"figure8_end_{f8['phase']}"] += 1
            self.blocked.difference_update(f8["links"])
            self.trace_event("net", "heal", why)
        self.quiet_until = self.now

    def _figure8_leader(self, n: Node, term: int) -> None:
        """Fault figure8, steps 2 and 3: a node became leader."""
        f8 = self.f8
        xy = (f8["x"], f8["y"])
        if f8["phase"] == "cut" and n.idx not in xy and term > f8["term"]:
            links = self._isolate([n.idx])  # Z: its NOOP goes nowhere
            self.blocked.difference_update(f8["links"])
            self.blocked.update(links)
            self.blocked.update(self._isolate(list(xy)))
            f8.update(phase="z-cut", z=n.idx, links=links + self._isolate(list(xy)))
            self.trace_event("net", "cut", f"figure8: isolate {n.id}, just elected in term {term}")

            def rejoin() -> None:
                if self.f8 is f8 and f8["phase"] == "z-cut":
                    self.blocked.difference_update(f8["links"])
                    f8["links"] = self._isolate([f8["z"]])
                    self.blocked.update(f8["links"])
                    f8["phase"] = "rejoin"
                    self.trace_event("net", "heal", f"figure8: n{f8['x']} and n{f8['y']} rejoin, n{f8['z']} stays away")

            self.schedule(self.now + self.rng.randint(200, 800), "call", rejoin)
        elif f8["phase"] == "rejoin":
            if n.idx in xy:
                f8.update(phase="leading", lead=n.idx, lead_term=term)
            else:
                self._figure8_end(f"figure8: {n.id} led instead")

    def on_quorum_write(self, n: Node, index: int, term: int) -> None:
        """Fault figure8, step 4: the leader of step 3 published its first quorum index."""
        f8 = self.f8
        if f8 is None or f8["phase"] != "leading" or n.idx != f8["lead"] or not self.faulting:
            return
        if index <= max(m.max_committed for m in self.nodes):
            return  # not a commit: the first view a new ack checker publishes
        f8["phase"] = "crash"
        lead = n
        other = self.nodes[f8["y"] if f8["lead"] == f8["x"] else f8["x"]]
        r = self.rng

        def strike() -> None:
            if self.f8 is not f8:
                return
            self.trace_event("sim", "figure8", f"crash {lead.id} after its quorum {index} (term {term}); "
                             f"{other.id} away, n{f8['z']} back")
            self.crash_node(lead, torn=False, down_ms=r.randint(4000, 6000))
            for m in self.nodes:  # the two others' handlers die too: the pushes in flight are lost
                h = self._node_actor(m, "handler") if m.idx not in (lead.idx, other.idx, f8["z"]) else None
                if h is not None:
                    self.kill_actor(h, "figure8")
            self.blocked.difference_update(f8["links"])
            f8["links"] = self._isolate([other.idx])
            self.blocked.update(f8["links"])
            f8["phase"] = "z-back"

            def done() -> None:
                if self.f8 is f8:
                    self._figure8_end("figure8: done")

            self.schedule(self.now + r.randint(3000, 5000), "call", done)

        self.schedule(self.now + r.randint(3, 15), "call", strike)

    def _lagging_install_shape(self) -> None:
        """A follower (or the leader, which then comes back as a follower with an uncommitted
        tail) is kept away -- cut off, or its node down -- for 2-8 s while the writers write:
        snapshots are taken and retention deletes the entries it would need, so when it is back
        the leader must install its snapshot. Other faults are held off while it is away, not
        during the install that follows (the install faults of `_install_frame` aim at it)."""
        r = self.rng
        up = [m for m in self.nodes if m.up]
        if not up:
            return
        lead = [m for m in up if m.block.member.role == Role.LEADER]
        followers = [m for m in up if m not in lead]
        z = lead[0] if lead and (not followers or r.random() < 0.2) else r.choice(followers or up)
        ms = r.randint(2000, 8000)
        self.quiet_until = self.now + ms
        self.stats["lagging_install_shapes"] += 1
        if r.random() < 0.6 and "partition" in self.faults or "crash" not in self.faults:
            self._cut(self._isolate([z.idx]), f"keep {z.id} away (install)", ms)
        else:
            self.trace_event("sim", "lagging", f"{z.id} down for {ms} ms (install)")
            self.crash_node(z, torn=r.random() < 0.5, down_ms=ms)

    def heal_all(self) -> None:
        self.faulting = False
        self.f8 = None
        self.writing = True
        self.blocked.clear()
        self.trace_event("sim", "heal", "faults off; every node and role restarted")
        for n in self.nodes:
            n.disk_full_until = 0
            n.probe_full_until = 0
            n.answers_lost_until = 0
            for a in list(n.roles.values()):
                if a.alive and a.paused:
                    self.resume_actor(a)
        for n in self.nodes:
            if not n.up:
                self.restart_node(n)
            else:
                for a in list(n.roles.values()):
                    if not a.alive:
                        self._restart_role(n, a.key, n.life)
