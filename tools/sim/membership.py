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
        peers = n.cfg.peer_map
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
        peers = n.cfg.peer_map
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
        self.trace_event(n.id, "member-change", f"{change.kind.name} {change.id}: {code.name} {index} {reason[:60]}")
