"""The elector role class (node/roles/elector.py) driven in-process through its injectable I/O
(docs/contracts.md C7): a fake transport, a virtual clock, a real shared block. What the role adds
to the core: the block's ledger end and writability, CONFIRM_LEADERSHIP and transfers on the control
channel, a damaged term/vote file that is not trusted, and a node that must not vote."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ipc import protocol as P
from ipc.codes import ResponseCode, Role, VoteResult
from node.block.shared_state import SharedState, segment_name
from node.config import NodeConfig
from node.roles.elector import Elector
from node.store.term_vote import LOST_VOTE, TermVote, TermVoteFile
from node.wiring import channels
from node.wiring.slot_file import SlotFile

PEERS = "n0-127.0.0.1:20001;n1-127.0.0.1:20003;n2-127.0.0.1:20005"


class Fatal(Exception):
    pass


@dataclass
class FakeRC:
    cfg: NodeConfig
    state: SharedState
    run_dir: Path
    now: int = 1_000
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("test.elector"))

    def clock(self) -> int:
        return self.now

    def fatal(self, message: str):
        raise Fatal(message)


@dataclass
class FakeTransport:
    sent: list[tuple[str, object]] = field(default_factory=list)
    replies: list[tuple[bytes, object]] = field(default_factory=list)
    roles: list[bytes] = field(default_factory=list)
    control: list[tuple[bytes, object]] = field(default_factory=list)
    down: set[str] = field(default_factory=set)

    def send(self, peer: str, frame: bytes) -> bool:
        if peer in self.down:
            return False
        self.sent.append((peer, P.decode(frame)))
        return True

    def reply(self, ident: bytes, frame: bytes) -> None:
        self.replies.append((ident, P.decode(frame)))

    def role_changed(self, frame: bytes) -> None:
        self.roles.append(frame)

    def control_reply(self, ident: bytes, frame: bytes) -> None:
        self.control.append((ident, frame if frame == channels.LEADERSHIP_CONFIRMED else P.decode(frame)))

    def take(self, kind: type) -> list[tuple[str, object]]:
        out = [(p, m) for p, m in self.sent if isinstance(m, kind)]
        self.sent = [(p, m) for p, m in self.sent if not isinstance(m, kind)]
        return out


@pytest.fixture
def rc(tmp_path):
    store = tmp_path / "n0"
    store.mkdir()
    cfg = NodeConfig(id="n0", peers=PEERS, group="g", store_dir=str(store))
    st = SharedState.create(segment_name("g", "n0", str(store)), 3, 0)  # no writer checks
    st.write_ledger(ledger_end_index=-1, ledger_end_term=-1)
    try:
        yield FakeRC(cfg, st, tmp_path)
    finally:
        st.unlink()
        st.close()


def started(rc: FakeRC) -> tuple[Elector, FakeTransport]:
    el = Elector(rc)
    el.transport = tr = FakeTransport()
    el.start()
    return el, tr


def lead(rc: FakeRC) -> tuple[Elector, FakeTransport]:
    """n0 wins its first vote round with n1's vote."""
    el, tr = started(rc)
    rc.now = el.core.next_deadline(rc.now)
    el.tick()
    for peer, req in tr.take(P.VoteRequest):
        if peer == "n1":
            el.on_response(P.encode(P.VoteResponse(200, "g", req.term, "", VoteResult.ACCEPT, -1, -1,
                                                   req.request_id)))
    assert rc.state.read_member().role == Role.LEADER
    answer_heartbeats(el, tr, "n1")
    return el, tr


def answer_heartbeats(el: Elector, tr: FakeTransport, *peers: str) -> None:
    el.tick()
    for peer, req in tr.take(P.HeartbeatRequest):
        if peer in peers:
            el.on_response(P.encode(P.HeartbeatResponse(200, "g", req.term, "n0", req.request_id)))


@pytest.mark.parametrize("content", [b"\xff\xfe\x00", b"currTerm=x\nvoteLeader=\n"])
def test_damaged_term_file_is_not_trusted_and_replaced_by_the_first_save(rc, content):
    """Not a fatal stop any more: the elector learns the group's term before voting
    (`_learn_group_term`); the damaged file is never read as term 0."""
    path = Path(rc.cfg.store_dir) / "currterm"
    path.write_bytes(content)
    el = Elector(rc)
    assert el.termvote.damaged is not None and str(path) in el.termvote.damaged
    el.termvote.save(7, LOST_VOTE)
    assert TermVoteFile(rc.cfg.store_dir).current == TermVote(7, LOST_VOTE)


def test_a_lost_vote_refuses_every_vote_in_its_term_only(rc):
    (Path(rc.cfg.store_dir) / "currterm").write_text(f"currTerm=7\nvoteLeader={LOST_VOTE}\n")
    el, tr = started(rc)
    el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n1", 7, -1, -1, 1)))
    assert tr.replies[-1][1].vote_result == VoteResult.REJECT_ALREADY_VOTED
    el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n1", 8, -1, -1, 2)))  # enters 8 first
    el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n1", 8, -1, -1, 3)))
    assert tr.replies[-1][1].vote_result == VoteResult.ACCEPT


def test_a_member_catching_up_after_a_lost_disk_votes_only_for_a_log_that_holds_what_the_group_had(rc):
    """It recorded term 7, 'catch up to index 10' (the highest end it heard) and the floor
    (7, 10) (the most up to date log it heard of): a candidate whose log reaches the floor in
    Raft's order holds every entry it could have stored, so it
    gets the vote; any other gets no answer (UNKNOWN, no term adopted). A group whose
    leader died before pushing those entries here would otherwise never elect again. It never
    stands, and it keeps the catch-up in its file."""
    path = Path(rc.cfg.store_dir) / "currterm"
    path.write_text(f"currTerm=7\nvoteLeader={LOST_VOTE}\ncatchUpIndex=10\nvoteFloorTerm=7\nvoteFloorIndex=10\n")
    el, tr = started(rc)
    for rid, (end_term, end_index) in enumerate([(6, 50), (7, 9), (-1, -1)], start=1):
        el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n1", 8, end_term, end_index, rid)))
        assert tr.replies[-1][1].vote_result == VoteResult.UNKNOWN, (end_term, end_index)
        assert el.core.term == 7
    assert rc.state.get("not_voting") == 3
    el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n1", 8, 7, 10, 4)))  # enters 8 first
    assert tr.replies[-1][1].vote_result == VoteResult.REJECT_TERM_NOT_READY and el.core.term == 8
    el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n1", 8, 7, 10, 4)))
    assert tr.replies[-1][1].vote_result == VoteResult.ACCEPT
    assert TermVoteFile(rc.cfg.store_dir).current == TermVote(8, "n1", 10, (7, 10))
    el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n2", 8, 9, 3, 5)))  # one vote a term
    assert tr.replies[-1][1].vote_result == VoteResult.REJECT_ALREADY_VOTED
    for rid in (6, 7):  # a later term's candidate: entered, then granted
        el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n2", 9, 8, 0, rid)))
    assert tr.replies[-1][1].vote_result == VoteResult.ACCEPT
    tr.sent.clear()
    for _ in range(20):  # however long it waits, it never stands
        rc.now = el.core.next_deadline(rc.now)
        el.tick()
    assert tr.take(P.VoteRequest) == [] and rc.state.get("not_voting") == 3


@pytest.mark.parametrize("end_term,end_index,committed,caught_up", [
    (7, 9, 9, False),  # behind the catch-up index, all of it committed
    (6, 40, 4, False),  # longer, but its last term is older: Raft's order
    (7, 10, 4, True),  # its log reaches (7, 10), not yet committed here
    (8, 2, 2, True),  # a later leader's log: holds everything, though shorter
    (5, 12, 10, True),  # committed up to the index: the first rule
])
def test_a_member_catching_up_is_caught_up_once_its_own_log_reaches_the_catch_up_term_and_index(
        rc, end_term, end_index, committed, caught_up):
    """The highest end it heard may be a tail no majority stored, which the group may never
    commit: a log that reaches (voteFloorTerm, voteFloorIndex) holds every entry the lost disk
    could have held, so the member votes and stands again (the simulator's lost-disk fault,
    seed 1,748: it was the only member with the committed entries, and could not stand)."""
    (Path(rc.cfg.store_dir) / "currterm").write_text(
        f"currTerm=8\nvoteLeader={LOST_VOTE}\ncatchUpIndex=10\nvoteFloorTerm=7\nvoteFloorIndex=10\n")
    rc.state.write_ledger(ledger_end_index=end_index, ledger_end_term=end_term, committed_index=committed)
    el, _ = started(rc)
    assert (rc.state.get("not_voting") == 0) == caught_up
    assert (TermVoteFile(rc.cfg.store_dir).current.catch_up == -1) == caught_up


def test_a_catch_up_recorded_without_a_floor_gives_no_vote_at_all(rc):
    """A file written before the floor was recorded: none is known, so the member waits to
    catch up as it always did."""
    (Path(rc.cfg.store_dir) / "currterm").write_text(f"currTerm=7\nvoteLeader={LOST_VOTE}\ncatchUpIndex=10\n")
    el, tr = started(rc)
    el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n1", 8, 7, 10, 1)))
    assert tr.replies[-1][1].vote_result == VoteResult.UNKNOWN


@pytest.mark.parametrize("field,value", [("repair_index", 40)])
def test_a_repairing_node_neither_votes_nor_stands_and_a_leader_steps_down(rc, field, value):
    el, tr = lead(rc)
    rc.state.set(field, value)
    rc.now += el.next_wait_ms() + 1
    el.tick()
    assert rc.state.read_member().role != Role.LEADER
    assert rc.state.get("not_voting") == 1
    el.on_request(b"c", P.encode(P.VoteRequest("g", "n0", "n1", 50, -1, -1, 9)))
    assert tr.replies[-1][1].vote_result == VoteResult.UNKNOWN
    assert el.core.term < 50  # no term adoption either
    tr.sent.clear()
    for _ in range(20):  # however long it waits, it never stands
        rc.now = el.core.next_deadline(rc.now)
        el.tick()
    assert tr.take(P.VoteRequest) == []
    rc.state.set(field, -1)
    rc.now = el.core.next_deadline(rc.now) + 1000
    el.tick()
    rc.now = el.core.next_deadline(rc.now)
    el.tick()
    assert tr.take(P.VoteRequest) and rc.state.get("not_voting") == 0


def test_start_publishes_candidate_and_first_vote_is_in_a_new_term(rc):
    (Path(rc.cfg.store_dir) / "currterm").write_text("currTerm=4\nvoteLeader=n0\n")
    el, tr = started(rc)
    m = rc.state.read_member()
    assert (m.role, m.current_term) == (Role.CANDIDATE, 4) and len(tr.roles) == 1
    el.tick()
    assert tr.sent == []  # not at once
    rc.now += el.next_wait_ms()
    el.tick()
    assert {req.term for _, req in tr.take(P.VoteRequest)} == {5}
    assert el.termvote.current.term == 5  # persisted before the requests left


def test_a_member_with_nothing_on_disk_campaigns_without_the_heartbeat_wait(rc):
    el, tr = started(rc)  # no currterm file, an empty ledger: a new member
    hb = rc.cfg.election_config().heartbeat_interval_ms
    assert el.next_wait_ms() < rc.cfg.election_config().max_vote_interval_ms
    rc.now += el.next_wait_ms()
    el.tick()
    assert {req.term for _, req in tr.take(P.VoteRequest)} == {1}
    # with a term/vote file (it voted once, or learned a term): the heartbeat interval first
    (Path(rc.cfg.store_dir) / "currterm").write_text("currTerm=0\nvoteLeader=\n")
    el2, _ = started(rc)
    assert el2.next_wait_ms() >= hb + rc.cfg.election_config().min_vote_interval_ms


def test_confirm_leadership_starts_a_heartbeat_round_whose_start_is_published_then_wakes_the_handler(rc):
    el, tr = lead(rc)
    rc.now += 50  # mid-interval: nothing due by the clock
    el.tick()
    assert tr.take(P.HeartbeatRequest) == []
    asked = rc.now
    el.on_control(b"handler", channels.CONFIRM_LEADERSHIP)
    beats = tr.take(P.HeartbeatRequest)
    assert sorted(p for p, _ in beats) == ["n1", "n2"]
    assert rc.state.read_member().last_quorum_heartbeat_ms < asked
    rc.now += 7
    for peer, req in beats:
        if peer == "n1":
            el.on_response(P.encode(P.HeartbeatResponse(200, "g", req.term, "n0", req.request_id)))
    assert rc.state.read_member().last_quorum_heartbeat_ms == asked
    # ... and the handler that asked is woken on the control channel, after the block says so
    assert tr.control == [(b"handler", channels.LEADERSHIP_CONFIRMED)]


def test_leader_steps_down_when_the_handler_cannot_write(rc):
    el, tr = lead(rc)
    rc.state.set("store_unwritable_ms", rc.now)
    rc.now += rc.cfg.heartbeat_interval_ms
    el.tick()
    m = rc.state.read_member()
    assert m.role == Role.CANDIDATE and tr.take(P.HeartbeatRequest) == []
    for _ in range(5):  # and it does not stand while it cannot write
        rc.now += el.next_wait_ms()
        el.tick()
        assert tr.take(P.VoteRequest) == []


def test_transfer_requests_are_answered_on_the_control_channel(rc):
    el, tr = lead(rc)
    el.on_control(b"h1", P.encode(P.LeadershipTransferRequest("g", "n0", "n9", -1, 77)))
    ((ident, resp),) = tr.control
    assert ident == b"h1" and resp.code == ResponseCode.UNKNOWN_MEMBER and resp.request_id == 77


def test_transfer_sends_take_leadership_to_a_caught_up_target(rc):
    el, tr = lead(rc)
    term = el.core.term
    rc.state.write_peer(1, match_index=-1, match_term=term)
    el.on_control(b"h1", P.encode(P.LeadershipTransferRequest("g", "n0", "n1", -1, 78)))
    assert rc.state.read_member().transferee_slot == 1
    el.tick()
    ((peer, take),) = tr.take(P.TakeLeadershipRequest)
    assert peer == "n1" and take.term == term
    el.on_response(P.encode(P.TakeLeadershipResponse(int(ResponseCode.TAKE_LEADERSHIP_FAILED), "g",
                                                     term, "", take.request_id)))
    ((_, resp),) = tr.control
    assert resp.code == ResponseCode.TAKE_LEADERSHIP_FAILED
    assert rc.state.read_member().transferee_slot != 1


def test_unreachable_peer_counts_as_no_answer(rc):
    el, tr = started(rc)
    tr.down = {"n1", "n2"}
    rc.now = el.core.next_deadline(rc.now)
    el.tick()  # both sends fail at once: the round ends without waiting for its deadline
    assert el.core._vote_round is None and el.core.role == Role.CANDIDATE


def test_a_term_file_that_cannot_be_written_is_a_fatal_stop_not_a_crash_loop(rc, monkeypatch):
    """ENOSPC while saving currterm reaches the elector as the store's DiskFull (not OSError):
    it must still be a one-line fatal stop naming the file, not a traceback and a restart."""
    import errno
    import os

    el, tr = started(rc)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    monkeypatch.setattr(os, "write", full)
    rc.now += el.next_wait_ms()
    with pytest.raises(Fatal) as ei:
        el.tick()  # the first campaign persists term + 1
    msg = str(ei.value)
    assert "currterm" in msg and "\n" not in msg


def test_a_leader_no_configuration_here_names_is_followed_through_a_guest_slot(rc):
    """A member whose log lacks the entry that added the leader (it was down then) must follow
    that leader to receive it: its elector gives the leader a guest slot in the run's slot
    table (node/core/slots.py), so the block names it and the handler accepts its pushes.
    Before, the heartbeat was refused as UNKNOWN_MEMBER and the member stayed behind for ever
    (the simulator's join fault)."""
    el, tr = started(rc)
    el.on_request(b"h", P.encode(P.HeartbeatRequest("g", "n0", "n9", el.core.term, 1)))
    m = rc.state.read_member()
    assert (m.role, el.core.leader_id) == (Role.FOLLOWER, "n9")
    table = SlotFile(rc.run_dir).read()
    assert table is not None and m.leader_slot == table.slot_of("n9") == 3
    assert table.owners[3].guest and "n9" not in el.others  # followed, never dialed
