"""The real Handler with client sessions: a retried append is answered, not written twice."""

from __future__ import annotations

from pathlib import Path

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.core.sessions import session_id
from node.store.stamps import session_stamps
from tests.unit.test_replication_roles import (
    Clock,
    FakeState,
    commit_all,
    leader_handler,
    make_handler,
    member,
    store_of,
)


def open_session(h, wire, rid: int) -> int:  # noqa: ANN001
    h.handle_frame(b"c", P.encode(P.OpenSessionRequest("g", "n1", rid)))
    r = wire.answer(rid)
    assert isinstance(r, P.OpenSessionResponse) and r.code == RC.SUCCESS, r
    return r.session


def append(h, rid: int, session: int, seq: int, body: bytes = b"x") -> None:  # noqa: ANN001
    h.handle_frame(b"c", P.encode(P.AppendRequest("g", "n1", body, rid, session, seq)))


def batch(h, rid: int, session: int, first_seq: int, bodies: list[bytes]) -> None:  # noqa: ANN001
    h.handle_frame(b"c", P.encode(P.BatchAppendRequest("g", "n1", bodies, rid, session, first_seq)))


def test_a_leader_opens_distinct_sessions_of_its_term(tmp_path: Path) -> None:
    h, wire, _state = leader_handler(tmp_path, Clock())
    a, b = open_session(h, wire, 1), open_session(h, wire, 2)
    assert (a, b) == (session_id(3, 1), session_id(3, 2))


def test_a_retry_of_a_committed_append_gets_its_index_and_nothing_is_written(tmp_path: Path) -> None:
    h, wire, state = leader_handler(tmp_path, Clock())
    s = open_session(h, wire, 1)
    append(h, 10, s, 1, b"first")
    commit_all(h, state)
    first = wire.answer(10)
    assert first.code == RC.SUCCESS
    end = h.store.ledger_end_index
    append(h, 11, s, 1, b"first")  # the client never saw answer 10 and resends
    again = wire.answer(11)
    assert (again.code, again.index, again.pos) == (RC.SUCCESS, first.index, first.pos)
    assert h.store.ledger_end_index == end
    append(h, 12, s, 2, b"second")
    commit_all(h, state)
    assert wire.answer(12).index == end + 1
    assert bytes(h.store.get(end + 1).body) == b"second"


def test_a_retry_of_a_pending_append_is_answered_when_it_commits(tmp_path: Path) -> None:
    h, wire, state = leader_handler(tmp_path, Clock())
    s = open_session(h, wire, 1)
    batch(h, 10, s, 1, [b"a", b"b", b"c"])
    batch(h, 11, s, 1, [b"a", b"b", b"c"])  # resent before the first was answered
    assert wire.answer(10) is None and wire.answer(11) is None
    assert h.pending.entries == 3  # the retry replaced the first attempt's reply
    end = h.store.ledger_end_index
    commit_all(h, state)
    got = wire.answer(11)
    assert isinstance(got, P.BatchAppendResponse) and got.code == RC.SUCCESS
    assert (got.first_index, len(got.positions)) == (end - 2, 3)
    assert wire.answer(10) is None and h.store.ledger_end_index == end


def test_gaps_straddles_and_unknown_sessions_get_their_codes(tmp_path: Path) -> None:
    h, wire, state = leader_handler(tmp_path, Clock())
    s = open_session(h, wire, 1)
    batch(h, 10, s, 1, [b"a", b"b"])
    append(h, 11, s, 5)
    assert wire.answer(11).code == RC.SESSION_SEQ_GAP
    batch(h, 12, s, 2, [b"b", b"c"])
    assert wire.answer(12).code == RC.SESSION_SEQ_INVALID
    append(h, 13, session_id(2, 9), 4)  # a session this leader never heard of, mid-stream
    assert wire.answer(13).code == RC.SESSION_EXPIRED
    append(h, 14, session_id(2, 9), 1)  # an earlier term's: its seq 1 may be beyond the scan
    assert wire.answer(14).code == RC.SESSION_EXPIRED
    append(h, 15, session_id(3, 9), 1)  # this term's, not handed out here: it may be in the log
    assert wire.answer(15).code == RC.SESSION_EXPIRED
    fresh = open_session(h, wire, 16)
    append(h, 17, fresh, 1)  # handed out here, nothing written yet: a first append starts it
    commit_all(h, state)
    assert wire.answer(17).code == RC.SUCCESS


def bodies(h) -> list[bytes]:  # noqa: ANN001
    s = h.store
    return [bytes(s.get(i).body) for i in range(max(s.ledger_begin_index, 0), s.ledger_end_index + 1)]


def test_an_evicted_session_of_the_leaders_term_is_never_written_twice(tmp_path: Path) -> None:
    """The table evicts the least recently appending session (max_sessions): its seq-1 resend
    must not look like a new session's first append. Before the fix it was written again."""
    h, wire, state = leader_handler(tmp_path, Clock(), max_sessions=2)
    victim = open_session(h, wire, 1)
    append(h, 10, victim, 1, b"victim")
    commit_all(h, state)
    assert wire.answer(10).code == RC.SUCCESS
    for rid in (20, 30):  # two more clients append: the victim is evicted
        append(h, rid + 1, open_session(h, wire, rid), 1, b"other")
    commit_all(h, state)
    append(h, 11, victim, 1, b"victim")  # the client never saw answer 10
    commit_all(h, state)
    assert wire.answer(11).code == RC.SESSION_EXPIRED  # the client: indeterminate, never resent as new
    assert bodies(h).count(b"victim") == 1


def test_a_restarted_handler_does_not_write_a_lost_sessions_seq_1_again(tmp_path: Path) -> None:
    """The handler restarts in the same term and rebuilds its table from only the newest
    session_scan_entries entries; the session's seq 1 lies before them. Before the fix its
    resend was written a second time."""
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock, session_scan_entries=4)
    victim = open_session(h, wire, 1)
    append(h, 10, victim, 1, b"victim")
    for k in range(6):
        h.handle_frame(b"o", P.encode(P.AppendRequest("g", "n1", b"plain%d" % k, 100 + k)))
    commit_all(h, state)
    h2, wire2 = make_handler(tmp_path, "n1", state, clock, store=h.store, session_scan_entries=4)
    h2.tick()
    assert h2.leader_term == 3
    append(h2, 11, victim, 1, b"victim")
    commit_all(h2, state)
    assert wire2.answer(11).code == RC.SESSION_EXPIRED
    assert bodies(h2).count(b"victim") == 1


def test_a_resend_of_a_stored_append_is_answered_with_its_index_on_a_full_disk(tmp_path: Path) -> None:
    """The session check runs before the capacity refusals: a resend the leader holds needs no
    room. Before the fix it was answered DISK_FULL, a definite 'not stored'."""
    h, wire, state = leader_handler(tmp_path, Clock())
    s = open_session(h, wire, 1)
    append(h, 10, s, 1, b"first")
    commit_all(h, state)
    first = wire.answer(10)
    h.ledger.disk_full, h.ledger.next_disk_check = True, h.now() + 10**9
    append(h, 11, s, 1, b"first")
    again = wire.answer(11)
    assert (again.code, again.index) == (RC.SUCCESS, first.index)
    append(h, 12, s, 2, b"second")  # a new write is still refused
    assert wire.answer(12).code == RC.DISK_FULL


def test_a_resend_of_an_entry_retention_deleted_is_answered_with_its_index(tmp_path: Path) -> None:
    """Retention deleted the entry the session table points to. Before the fix the resend was
    answered INTERNAL_ERROR; the entry was committed, so its index is the answer."""
    clock = Clock()
    state = FakeState()
    state.member = member(Role.LEADER, 3, 1, quorum_ms=clock.now)
    h, wire = make_handler(tmp_path, "n1", state, clock, data_file_size=4096, index_file_size=1024)
    h.tick()
    s = open_session(h, wire, 1)
    append(h, 10, s, 1, b"pay-invoice-42")
    commit_all(h, state)
    first = wire.answer(10)
    for k in range(200):
        h.handle_frame(b"o", P.encode(P.AppendRequest("g", "n1", b"y" * 100, 1000 + k)))
    commit_all(h, state)
    assert h.store.delete_before(h.store.committed_index) > 0
    assert h.store.ledger_begin_index > first.index
    end = h.store.ledger_end_index
    append(h, 11, s, 1, b"pay-invoice-42")
    again = wire.answer(11)
    assert (again.code, again.index, again.term, again.pos) == (RC.SUCCESS, first.index, -1, -1)
    assert h.store.ledger_end_index == end
    h.store.close()  # its checkpoint thread must not outlive tmp_path (it logged "No such file")


def test_one_stamp_twice_in_one_multi_is_written_once(tmp_path: Path) -> None:
    """A misbehaving client sends (S,1), (S,2), (S,1) in one MULTI: the repeat is answered as
    the resend it is, with the first copy's index (and, as any resend of a pending append,
    takes over the first copy's reply). Before the fix it was written twice and the table's
    last seq went wrong."""
    h, wire, state = leader_handler(tmp_path, Clock())
    s = open_session(h, wire, 1)
    frames = [P.encode(P.AppendRequest("g", "n1", body, rid, s, seq))
              for rid, body, seq in ((10, b"A", 1), (11, b"B", 2), (12, b"A", 1), (13, b"C", 4))]
    h.handle_frame(b"c", P.encode_multi(frames))
    commit_all(h, state)
    h.tick()  # flushes the coalesced replies
    assert bodies(h).count(b"A") == 1 and b"C" not in bodies(h)
    inner = {m.request_id: m for _i, multi in wire.replies if isinstance(multi, P.Multi)
             for m in map(P.decode, multi.frames)}
    repeat = inner[12]
    assert repeat.code == RC.SUCCESS and bytes(h.store.get(repeat.index).body) == b"A"
    assert inner[11].index == repeat.index + 1
    assert inner[13].code == RC.SESSION_SEQ_GAP
    assert h.sessions.last_seq(s) == 2
    assert [seq for _i, sid, seq in session_stamps(h.store, 10) if sid == s] == [1, 2]


def test_single_appends_of_one_multi_are_deduplicated_one_by_one(tmp_path: Path) -> None:
    h, wire, state = leader_handler(tmp_path, Clock())
    s = open_session(h, wire, 1)
    frames = [P.encode(P.AppendRequest("g", "n1", b"m%d" % k, 20 + k, s, 1 + k)) for k in range(3)]
    h.handle_frame(b"c", P.encode_multi(frames))
    end = h.store.ledger_end_index
    resend = [P.encode(P.AppendRequest("g", "n1", b"m%d" % k, 30 + k, s, 1 + k)) for k in range(4)]
    h.handle_frame(b"c", P.encode_multi(resend))  # the three again, and one new
    assert h.store.ledger_end_index == end + 1
    commit_all(h, state)
    h.tick()  # flushes the coalesced replies
    inner = {m.request_id: m for _i, multi in wire.replies if isinstance(multi, P.Multi)
             for m in map(P.decode, multi.frames)}
    assert [inner[30 + k].index for k in range(4)] == [end - 2, end - 1, end, end + 1]
    assert [stamp[1:] for stamp in session_stamps(h.store, 4)] == [(s, 1), (s, 2), (s, 3), (s, 4)]


def test_a_new_leader_rebuilds_the_sessions_from_its_log(tmp_path: Path) -> None:
    """Leader n1 of term 3 writes a session's batch; n1 then leads term 4 (as a new leader
    after a failover would, with the same log): the retry is recognised from the log."""
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    s = open_session(h, wire, 1)
    batch(h, 10, s, 1, [b"a", b"b"])
    commit_all(h, state)
    first = wire.answer(10).first_index
    state.member = member(Role.FOLLOWER, 4, 0)
    h.tick()
    assert h.leader_term == -1
    state.member = member(Role.LEADER, 4, 1, quorum_ms=clock.now)
    h.tick()  # the NOOP of term 4, and the table rebuilt from the log
    assert h.leader_term == 4
    batch(h, 11, s, 1, [b"a", b"b"])
    commit_all(h, state)
    got = wire.answer(11)
    assert (got.code, got.first_index) == (RC.SUCCESS, first)
    assert open_session(h, wire, 12) == session_id(4, 1)


def test_a_retry_across_a_term_change_is_answered_with_the_entry_term(tmp_path: Path) -> None:
    """The answer to a retry says where the entry is: its index and *its* term (written in
    term 3), not the term of the leader that recognised the retry (found by `dledger chaos`:
    an acknowledgement whose (index, term) named no entry of the log)."""
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    s = open_session(h, wire, 1)
    append(h, 10, s, 1, b"one")
    batch(h, 11, s, 2, [b"two", b"three"])
    commit_all(h, state)
    single, pair = wire.answer(10), wire.answer(11)
    assert single.term == pair.term == 3
    state.member = member(Role.FOLLOWER, 4, 0)
    h.tick()
    state.member = member(Role.LEADER, 4, 1, quorum_ms=clock.now)
    h.tick()
    assert h.leader_term == 4
    append(h, 12, s, 1, b"one")
    batch(h, 13, s, 2, [b"two", b"three"])
    commit_all(h, state)
    again, again_pair = wire.answer(12), wire.answer(13)
    assert (again.code, again.index, again.term) == (RC.SUCCESS, single.index, 3)
    assert (again_pair.code, again_pair.first_index, again_pair.term) == (RC.SUCCESS, pair.first_index, 3)
    assert h.store.get(single.index).term == 3


def test_a_follower_refuses_to_open_a_session(tmp_path: Path) -> None:
    state = FakeState()
    state.member = member(Role.FOLLOWER, 3, 0)
    h, wire = make_handler(tmp_path, "n1", state, Clock(), store=store_of([1]))
    h.handle_frame(b"c", P.encode(P.OpenSessionRequest("g", "n1", 5)))
    assert wire.answer(5).code == RC.NOT_LEADER


def test_a_restarted_handler_never_hands_out_a_session_id_twice_in_a_term(tmp_path: Path) -> None:
    """The handler crashes and restarts while its node still leads term 3 (found by the
    simulator): ids handed out before, whose sessions have not appended yet, are in no log;
    the restarted handler continues after them."""
    clock = Clock()
    h, wire, state = leader_handler(tmp_path, clock)
    first = {open_session(h, wire, k) for k in range(1, 4)}
    store = h.store
    h2, wire2 = make_handler(tmp_path, "n1", state, clock, store=store)
    h2.tick()  # leads term 3 again: the NOOP, the table rebuilt from the log
    assert h2.leader_term == 3
    again = {open_session(h2, wire2, k) for k in range(10, 13)}
    assert not first & again


def test_pipelined_appends_behind_a_refused_one_on_a_full_disk_all_get_disk_full(tmp_path: Path) -> None:
    """Seq 1 of a new session is refused DISK_FULL; seqs 2 and 3, already in flight, are behind
    a hole, and nothing of them is stored either: they get DISK_FULL too (the honest reason),
    not a session code that sends the client through a resend first."""
    h, wire, _state = leader_handler(tmp_path, Clock())
    s = open_session(h, wire, 1)
    h.ledger.disk_full, h.ledger.next_disk_check = True, h.now() + 10**9
    for seq in (1, 2, 3):
        batch(h, 10 + seq, s, 1 + 2 * (seq - 1), [b"a", b"b"])
    assert [wire.answer(10 + seq).code for seq in (1, 2, 3)] == [RC.DISK_FULL] * 3
