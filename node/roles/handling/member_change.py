"""The leader's side of a membership change (docs/membership.md "The rules of a change").

One member snapshot decides: leadership (this term's NOOP written, the lease), then
`check_change` on the newest configuration in the log, this term's NOOP index and the
committed index, and, for a promotion, the learner's peer record (match index and position,
alive) against the leader's ledger end. An accepted change is appended as the DLCF NOOP-bodied
entry (the configuration file first: node/roles/handling/configs.py) under the member lock
after re-checking leadership, published with the ledger end it makes, and answered like an
append: SUCCESS with its index once it commits, from the pending table.

A new member may be any machine (not only a `--peers` one): every node gives it a peer slot
when it stores the entry, and its supervisor starts a dispatcher for it (node/core/slots.py,
node.wiring.slot_file). A group started with one member is the exception: its leader commits
on its own end, with no ack checker counting a quorum, so it refuses every change with
UNSUPPORTED (`ONE_MEMBER_GROUP`); start a group with its members instead.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.entry_codec import MAGIC_NOOP
from ipc.security import KeyFileError, read_key_file
from node.core.membership import (
    Change,
    ChangeKind,
    LeaderState,
    LearnerProgress,
    apply_change,
    check_change,
    encode_configuration,
)
from node.core.pending import Pending
from node.observe.role_metrics import store_end_pos

if TYPE_CHECKING:
    from node.roles.handler import Handler

ONE_MEMBER_GROUP = ("a group started with one member commits on its own and cannot change its "
                    "members; start the group with all of its members (--peers)")

_WHY = {
    RC.TERM_NOT_READY: "no entry of this leader's term has committed yet: retry",
    RC.MEMBERSHIP_CHANGE_IN_PROGRESS: "the newest configuration is not committed yet: retry after it is",
    RC.MEMBER_EXISTS: "the id or the address is already a member's",
    RC.TOO_MANY_MEMBERS: "a configuration holds at most 16 members",
    RC.UNEXPECTED_ARGUMENT: "the id, host, port or key cannot be a member's",
    RC.UNKNOWN_MEMBER: "not a member of the newest configuration",
    RC.LEARNER_BEHIND: "the learner is not caught up, or not answering",
    RC.LAST_VOTER: "the change would remove the only voter",
    RC.MEMBERSHIP_NO_CHANGE: "the configuration already is what the change asks for",
}


@dataclass(frozen=True, slots=True)
class Proposed:
    """What `propose` did: `code` SUCCESS with the entry's `index` (and the term it was
    written in), or a refusal and its one line."""

    code: RC
    reason: str = ""
    index: int = -1
    term: int = -1
    pos: int = -1


class MemberChanges:
    """Decides and appends one change; answers it at commit."""

    def __init__(self, h: Handler) -> None:
        self.h = h

    def _new_members_key(self, member_id: str) -> tuple[str, str]:
        """(its Z85 public key, "") for a member added to a secure group, ("", "") in plain
        mode, ("", why) when the key is nowhere: the configuration entry carries the key so
        that every member admits the new one from the moment it stores the entry, without a
        restart (docs/membership.md "Processes"). Found in this node's keys (a --peers
        member's), else as `ID.key` in its keys dir."""
        server_keys = getattr(self.h.rc, "server_keys", None)
        keys = server_keys() if server_keys is not None else None
        if keys is None:
            return "", ""
        known = keys.member_public.get(member_id)
        if known is not None:
            return known.decode(), ""
        path = os.path.join(self.h.cfg.keys_dir, f"{member_id}.key")
        try:
            public, _ = read_key_file(path)
        except KeyFileError as e:
            return "", (f"a secure group needs the new member's public key: {e.problems[0]} "
                        f"(copy the `dledger keygen` file {member_id}.key into the leader's keys dir, "
                        "or give it with the change)")
        return public.decode(), ""

    def propose(self, change: Change) -> Proposed:
        """Decide `change` on one member snapshot and append it if accepted."""
        h = self.h
        now = h.now()
        m = h.state.read_member()
        refused = h.leader.refuse_leadership(m, now)
        if refused is not None:
            return Proposed(refused.code, refused.reason)
        if h.single:
            return Proposed(RC.UNSUPPORTED, ONE_MEMBER_GROUP)
        current = h.configs.latest
        if change.kind == ChangeKind.ADD_LEARNER and not change.public_key \
                and current.member(change.id) is None:
            key, why = self._new_members_key(change.id)
            if why:
                return Proposed(RC.UNEXPECTED_ARGUMENT, f"add_learner {change.id}: {why}")
            change = dataclasses.replace(change, public_key=key)
        s = h.store
        state = LeaderState(h.leader.noop_index, s.committed_index)
        progress = None
        if change.kind == ChangeKind.PROMOTE:
            slot = h.configs.slots.slot_of(change.id)
            if change.id == h.cfg.id:  # the leader's own log is the end itself
                progress = LearnerProgress(s.ledger_end_index, store_end_pos(s), True,
                                           s.ledger_end_index, store_end_pos(s))
            elif slot is None:  # not a member: check_change answers UNKNOWN_MEMBER
                progress = LearnerProgress(-1, -1, False, s.ledger_end_index, store_end_pos(s))
            else:
                p = h.state.read_peer(slot)  # one snapshot of its record
                # A watermark of an earlier term (another leadership's, maybe cut since) says
                # nothing about what the learner holds now: not answering in this term. And a
                # learner counts only once it stored the entry that names it: a node whose
                # elector is not following this leader yet (a joining node still learning the
                # group's term) refuses pushes, and promoting it would put a voter that answers
                # no heartbeat into the quorum (the leader's lease lapsed in a test that did).
                live = (bool(p.alive) and p.match_term == m.current_term
                        and p.match_index >= current.index)
                progress = LearnerProgress(p.match_index, p.match_pos, live,
                                           s.ledger_end_index, store_end_pos(s))
        code = check_change(current, change, state, progress)
        if code != RC.SUCCESS:
            return Proposed(code, f"{change.kind.name.lower()} {change.id}: {_WHY.get(code, code.name)}")
        written: list = []

        def write(term: int):  # noqa: ANN202 - the store's append result
            new = apply_change(current, change, s.ledger_end_index + 1)
            body = encode_configuration(new)
            configs = h.configs.before_store([(new.index, body)])
            r = s.append_leader(body, term, MAGIC_NOOP)
            h.configs.stored(configs)
            written.append(new)
            return r

        done, refused2 = h.appends._write_as_leader(write)  # noqa: SLF001 - the one leader write path
        if refused2 is not None:
            return Proposed(refused2[0], refused2[1])
        term, r = done
        new = written[0]
        h.log.warning("appended configuration entry %d (term %d): %s %s; voters %s, learners %s",
                      r.index, term, change.kind.name.lower(), change.id, ",".join(new.voters),
                      ",".join(new.learners) or "-")
        h.ledger.wake_dispatchers()
        if h.single:
            h.completion.commit_to(s.ledger_end_index)
        return Proposed(RC.SUCCESS, "", r.index, term, r.pos)

    def on_member_change(self, ident: bytes, req: P.MemberChangeRequest) -> None:
        """MEMBER_CHANGE: decided and appended at once; answered at commit, or refused now."""
        try:
            kind = ChangeKind(req.kind)
        except ValueError:  # the decoder admits only the known kinds: defensive
            self.h.replies.error(ident, req, RC.UNEXPECTED_ARGUMENT, f"change kind {req.kind}")
            return
        done = self.propose(Change(kind, req.member_id, req.host, req.port, req.public_key))
        if done.code != RC.SUCCESS:
            self.h.replies.error(ident, req, done.code, done.reason[:200])
            return
        self.answer_at_commit(ident, req.request_id, done)

    def answer_at_commit(self, ident: bytes, request_id: int, done: Proposed) -> None:
        """Register the reply of an appended change: SUCCESS with its index once it commits
        (an APPEND answer), TERM_CHANGED or a timeout as for any append."""
        self.h.pending.register(done.term, done.index, Pending(
            ident, request_id, done.index, None, done.pos,
            self.h.now() + self.h.cfg.max_wait_ack_ms, no_result=True))
