"""Fault `membership` (opt-in): random single-server changes among the bootstrap members,
mixed with the other faults, and their undoing at the heal (docs/membership.md).

A change is handed to the current leader's handler as an input of its own ("change"), decided
and appended there by the production code (`MemberChanges.propose`: one member snapshot,
`check_change`, the DLCF entry); its outcome is traced. What is checked
(tools/sim/invariants.py): a committed NOOP with a body is a configuration, and any two
successive committed configurations have intersecting majorities; with one leader per term
and no committed entry lost, as for every seed.

The kinds, drawn among what the newest configuration allows: remove a voter (the leader
itself one time in three: it must lead until the removal commits, then step down), re-add a
removed member as a learner, promote a learner. At the heal the group is brought back to every
`--peers` member a voter, one change at a time (`restore_membership`), before convergence is
judged."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ipc.codes import Role
from node.core.membership import Change, ChangeKind

if TYPE_CHECKING:
    from tools.sim.config import Node


class MembershipMixin:
    """`Sim`'s membership fault: needs `rng`, `nodes`, `stats` and the trace."""

    def member_addresses(self, n: Node) -> dict[str, tuple[str, int]]:
        """Every machine a change may name: the `--peers` members, and with fault `join` the
        machine outside them."""
        if not self.joins:
            return n.cfg.peer_map
        return {m.id: m.cfg.address for m in self.nodes}

    def _leader_handler(self) -> tuple[Node, Any] | None:
        for n in self.nodes:
            if n.up and n.block.member.role == Role.LEADER:
                a = self._node_actor(n, "handler")
                if a is not None and getattr(a, "opened", False):
                    return n, a
        return None

    def _propose(self, change: Change, why: str) -> None:
        got = self._leader_handler()
        if got is None:
            return
        n, a = got
        a.inbox.append(("change", change))
        self.trace_event(n.id, "member-change", f"{why}: {change.kind.name} {change.id}")

    def membership_fault(self) -> None:
        """One random change, if a leader is there to take it."""
        got = self._leader_handler()
        if got is None:
            return
        n, a = got
        c = a.h.configs.latest
        r = self.rng
        peers = self.member_addresses(n)
        choices: list[Change] = []
        if len(c.voters) > 1:
            choices += [Change(ChangeKind.REMOVE, v) for v in c.voters]
            if n.id in c.voters:
                choices += [Change(ChangeKind.REMOVE, n.id)] * len(c.voters)  # the leader itself, often
        choices += [Change(ChangeKind.REMOVE, x) for x in c.learners]
        choices += [Change(ChangeKind.ADD_LEARNER, x, *peers[x]) for x in peers if c.member(x) is None] * 2
        choices += [Change(ChangeKind.PROMOTE, x) for x in c.learners] * 2
        if choices:
            self.stats["membership_faults"] += 1
            self._propose(r.choice(choices), "fault")

    def restore_membership(self) -> bool:
        """At the heal: propose the next change toward every `--peers` member a voter. True
        while the leader's newest configuration is not that yet (or no leader is known)."""
        got = self._leader_handler()
        if got is None:
            return True
        n, a = got
        c = a.h.configs.latest
        peers = self.member_addresses(n)
        missing = [x for x in peers if c.member(x) is None]
        learners = list(c.learners)
        if not missing and not learners:
            return False
        if learners:
            self._propose(Change(ChangeKind.PROMOTE, learners[0]), "heal")
        else:
            self._propose(Change(ChangeKind.ADD_LEARNER, missing[0], *peers[missing[0]]), "heal")
        return True

    def on_change_result(self, n: Node, change: Change, code: Any, reason: str, index: int) -> None:
        self.stats[f"membership_{code.name.lower()}"] += 1
        s = getattr(self, "m15", None)
        if s is not None and s.get("y") == change and code.name == "SUCCESS":
            s["y_done"] = index
        self.trace_event(n.id, "member-change", f"{change.kind.name} {change.id}: {code.name} {index} {reason[:60]}")


# --------------------------------------------------------------------------------------------
# The three shapes of the 2015 single-server-change bug (docs/membership.md), as regression
# cases: faults m2015-two-removes, m2015-add-remove (5 nodes) and m2015-two-adds (6 nodes).
# --------------------------------------------------------------------------------------------
# Letters: a is the leader L1 once the group is in C0 (voters a, b, c, d; learners e, f). X is
# L1's change, appended on L1 alone (it is cut off first); Y is L2's change, L2 elected by
# b, c, d in a later term and handed Y at once, before its NOOP commits. m_x / m_y are the
# disjoint majorities of C0+X and C0+Y: at L2's election the rest of m_x is cut off with a
# (L2's NOOP must not reach it), Y commits on m_y (only if L2 may append it before its NOOP
# committed: the own-term rule, reverted by mutation membership-no-own-term), then a and the
# rest of m_x elect a again, and it commits X where the group committed L2's entries.
SHAPES_2015 = {
    "m2015-two-removes": (("remove", "d"), ("remove", "a"), "ab", "cd"),
    "m2015-add-remove": (("promote", "e"), ("remove", "d"), "ade", "bc"),
    "m2015-two-adds": (("promote", "e"), ("promote", "f"), "abe", "cdf"),
}
_KINDS = {"remove": ChangeKind.REMOVE, "promote": ChangeKind.PROMOTE}


class Shape2015Mixin:
    """`Sim`'s 2015 shapes (needs the MembershipMixin helpers and the network's `blocked`)."""

    def m15_start(self) -> None:
        """Called by the fault schedule: bring the group to C0 first (one change at a time)."""
        name = next(k for k in SHAPES_2015 if k in self.faults)
        got = self._leader_handler()
        if got is None:
            return
        n, _a = got
        others = [m.id for m in self.nodes if m.id != n.id]
        n_learners = len(self.nodes) - 4
        self.m15 = dict(name=name, phase="setup", learners=others[len(others) - n_learners:])
        self.quiet_until = self.now + 60_000  # no other fault shape meanwhile
        self.stats["m2015_shapes"] += 1
        self.trace_event("sim", "m2015", f"{name}: setting up C0 (learners {self.m15['learners']})")
        self.schedule(self.now + 50, "call", self._m15_setup)

    def _m15_setup(self) -> None:
        s = self.m15
        if s is None or s["phase"] != "setup" or not self.faulting:
            return
        got = self._leader_handler()
        self.schedule(self.now + 100, "call", self._m15_setup)
        if got is None:
            return
        n, a = got
        c = a.h.configs.latest
        peers = n.cfg.peer_map
        want_learners = s["learners"]
        if n.id in want_learners:
            return  # a learner-to-be leads: wait for another election
        for x in peers:
            m = c.member(x)
            if x in want_learners and m is not None and m.voter:
                return self._propose(Change(ChangeKind.REMOVE, x), "m2015 setup")
            if x in want_learners and m is None:
                return self._propose(Change(ChangeKind.ADD_LEARNER, x, *peers[x]), "m2015 setup")
            if x not in want_learners and m is None:
                return self._propose(Change(ChangeKind.ADD_LEARNER, x, *peers[x]), "m2015 setup")
            if x not in want_learners and not m.voter:
                return self._propose(Change(ChangeKind.PROMOTE, x), "m2015 setup")
        if a.h.store.committed_index < c.index or a.h.leader.noop_index > a.h.store.committed_index:
            return  # C0 not committed yet
        voters = [x for x in c.voters if x != n.id]
        # b, c, d are named once L2 is known (m15_leader), except the one X names
        names = dict(zip("abcdef", [n.id, *voters, *want_learners], strict=False))
        x_change, y_change, m_x, m_y = SHAPES_2015[s["name"]]
        s.update(phase="x", names=names, voters=voters, term=n.block.member.current_term, m_x=m_x,
                 m_y=m_y, fixed=x_change[1], y_change=y_change)
        lead = self.nodes[n.idx]
        self.blocked.update(self._isolate([lead.idx]))  # a: X stays on a alone
        self.trace_event("net", "cut", f"m2015: isolate L1 {n.id} ({names})")
        a.inbox.append(("change", Change(_KINDS[x_change[0]], names[x_change[1]])))
        self.schedule(self.now + 15_000, "call", lambda: self._m15_end("gave up"))

    def m15_leader(self, n: Node, term: int) -> None:
        """A node became leader (on_member_write): L2 in phase x, a again in phase rejoin."""
        s = self.m15
        if s is None or not self.faulting:
            return
        names = s.get("names", {})
        if s["phase"] == "x" and term > s["term"] and n.id in s["voters"]:
            named = _name_bcd(s, n.id)
            if named is None:
                return self._m15_end(f"{n.id} led: no naming puts it in m_y")
            names.update(named)
            y_change = s["y_change"]
            s["y"] = Change(_KINDS[y_change[0]], names[y_change[1]])
            rest_x = [self._idx(names[k]) for k in s["m_x"] if k != "a"]
            side_y = [m.idx for m in self.nodes if m.idx not in rest_x and m.id != names["a"]]
            self.blocked.clear()
            self.blocked.update(self._isolate([self._idx(names["a"])]))
            self.blocked.update((p, q) for p in rest_x for q in side_y)
            self.blocked.update((q, p) for p in rest_x for q in side_y)
            s.update(phase="y", l2=n.id)
            self.trace_event("net", "cut", f"m2015: L2 {n.id} elected in term {term}; m_x rest {rest_x} cut off")
            self._m15_offer_y()
            self.schedule(self.now + 1500, "call", self._m15_rejoin)
        elif s["phase"] == "rejoin" and n.id == names["a"]:
            s["phase"] = "a-leads"
            self.trace_event("sim", "m2015", f"L1 {n.id} leads again in term {term}")
            self.schedule(self.now + 2000, "call", lambda: self._m15_end("done"))

    def _m15_offer_y(self) -> None:
        """Hand Y to L2 as soon as its handler leads (its NOOP written), again every 10 ms
        until appended: the own-term rule refuses it (TERM_NOT_READY) until L2's NOOP commits,
        which it cannot while L1 and the rest of m_x are away."""
        s = self.m15
        if s is None or s["phase"] != "y" or s.get("y_done"):
            return
        n = next(m for m in self.nodes if m.id == s["l2"])
        a = self._node_actor(n, "handler")
        if a is not None and a.h.leader_term > s["term"]:
            a.inbox.append(("change", s["y"]))
        self.schedule(self.now + 10, "call", self._m15_offer_y)

    def _m15_rejoin(self) -> None:
        s = self.m15
        if s is None or s["phase"] != "y":
            return
        names = s["names"]
        side_x = [self._idx(names[k]) for k in s["m_x"]]
        self.blocked.clear()
        self.blocked.update(self._isolate(side_x))
        s["phase"] = "rejoin"
        self.trace_event("net", "cut", f"m2015: L1 {names['a']} rejoins m_x {side_x} only")

    def _m15_end(self, why: str) -> None:
        s, self.m15 = self.m15, None
        if s is None:
            return
        self.stats[f"m2015_end_{s['phase']}"] += 1
        self.blocked.clear()
        self.quiet_until = self.now
        self.trace_event("net", "heal", f"m2015: {why}")

    def _idx(self, node_id: str) -> int:
        return next(m.idx for m in self.nodes if m.id == node_id)


def _name_bcd(s: dict, l2: str) -> dict[str, str] | None:
    """Letters b, c, d for the three voters other than a, keeping the one X named, so that L2
    is in m_y (None: no such naming)."""
    from itertools import permutations

    fixed = s["fixed"]
    for perm in permutations(s["voters"]):
        named = dict(zip("bcd", perm, strict=True))
        if fixed in named and named[fixed] != s["names"][fixed]:
            continue
        if any(named[k] == l2 for k in s["m_y"] if k in named):
            return named
    return None
