"""Replication with real processes (docs/replication.md, docs/client.md; DLedger's AppendAndPushTest
scenarios)."""

import os
import signal

import pytest
import zmq
from cluster import read_log, wait_for

from ipc import protocol as P
from ipc.client import DLedgerError
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.block.shared_state import SharedState


def assert_identical_replicas(c, acked: dict[int, bytes]) -> list:
    """Freeze every node at once, read every store: all logs equal, every acknowledged append
    present at its index with its body (hashicorp's EnsureSame + VerifyLog). SIGSTOP-then-
    SIGKILL rather than one clean stop after another: stopping nodes in turn would let the
    survivors elect a new leader (and write its NOOP) between two stops."""
    for node in c.nodes.values():
        if node.alive:
            node.signal(signal.SIGSTOP)
    for node in c.nodes.values():
        node.kill()
    logs = {nid: read_log(node.store_dir) for nid, node in c.nodes.items()}
    ref_id, ref = max(logs.items(), key=lambda kv: len(kv[1]))
    for nid, log in logs.items():
        assert log == ref, f"{nid} differs from {ref_id} (lengths {len(log)} vs {len(ref)})"
    by_index = {e[0]: e for e in ref}
    missing = [i for i, body in acked.items() if i not in by_index or by_index[i][3] != body]
    assert not missing, f"{len(missing)} acknowledged appends lost or changed, e.g. {missing[:5]}"
    return ref


def test_10k_appends_single_batch_async_identical_everywhere(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    acked: dict[int, bytes] = {}
    with c.client() as cl:
        for i in range(1000):
            b = b"single-%d" % i
            acked[cl.append(b).index] = b
        for k in range(40):
            bodies = [b"batch-%d-%d" % (k, j) * (1 + j % 5) for j in range(100)]
            for r, b in zip(cl.append_batch(bodies), bodies, strict=True):
                acked[r.index] = b
        futs = [(b"async-%d" % i, cl.append_async(b"async-%d" % i)) for i in range(5000)]
        for b, f in futs:
            acked[f.result(timeout=30).index] = b
    assert len(acked) == 10_000
    c.wait_converged()
    log = assert_identical_replicas(c, acked)
    assert log[0][2] == 2 and log[0][3] == b""  # the first leader's NOOP


def test_commit_index_reaches_a_follower_that_starts_late(make_cluster):
    c = make_cluster(3, start=False)
    c.nodes["n0"].start()
    c.nodes["n1"].start()
    c.wait_leader(timeout=15, among=["n0", "n1"])
    with c.client() as cl:
        for i in range(100):
            cl.append(b"x%d" % i)
    c.nodes["n2"].start()
    c.wait_converged(timeout=20)  # n2 has everything and knows it is committed


def test_append_times_out_with_followers_down_then_commits_when_they_return(make_cluster):
    # A long heartbeat leak keeps the lone leader leading, so the pending append times out
    # (WAIT_QUORUM_ACK_TIMEOUT) instead of failing with TERM_CHANGED.
    c = make_cluster(3, max_heartbeat_leak=60, max_wait_ack_ms=500)
    lead = c.wait_leader(timeout=15)
    followers = [x for x in c.nodes if x != lead]
    # Every member votes: one that found the group already in a term when it first started
    # (slow to start) votes only once it has caught up, and a follower that cannot vote could
    # not help elect below (docs/election.md "Non-voting members").
    wait_for(lambda: all(_not_voting(c, n) == 0 for n in c.nodes), 30, "every member to vote")
    for f in followers:
        c.nodes[f].kill()
    # Without a session: the node's own answer is what this test is about (with one, the
    # client would resend until its timeout and end with TIMEOUT, also indeterminate).
    with c.client(timeout=3.0, sessions=False) as cl:
        with pytest.raises(DLedgerError) as ei:
            cl.append(b"waiting for a quorum")
        assert ei.value.code == RC.WAIT_QUORUM_ACK_TIMEOUT and ei.value.indeterminate
        end = c.metadata(lead).ledger_end_index
        # One follower returns: it cannot win an election alone (the leader's longer log
        # refuses it), so it follows the leader, and the pending entry reaches a quorum.
        # (Were both to return at once they could elect one of themselves without the entry:
        # that is exactly why the outcome was reported as indeterminate.)
        c.nodes[followers[0]].start()
        c.wait_converged(timeout=20, among=[lead, followers[0]])
        assert cl.get(end).body == b"waiting for a quorum"
        c.nodes[followers[1]].start()
        c.wait_converged(timeout=20)


def _not_voting(c, node_id: str) -> int:
    st = SharedState.attach(c.nodes[node_id].shm_name())
    try:
        return st.get("not_voting")
    finally:
        st.close()


def _raw_dealer(c, node_id):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{c.nodes[node_id].address}")
    return ctx, s


def test_leader_pending_full(make_cluster):
    c = make_cluster(3, max_heartbeat_leak=60, max_pending_requests=10, max_wait_ack_ms=5000)
    lead = c.wait_leader(timeout=15)
    for f in [x for x in c.nodes if x != lead]:
        c.nodes[f].kill()
    ctx, s = _raw_dealer(c, lead)
    try:
        for i in range(15):
            s.send(P.encode(P.AppendRequest("default", lead, b"p%d" % i, request_id=i + 1)))
        replies = []
        while s.poll(1000):
            replies.append(P.decode(s.recv()))
        full = [r for r in replies if r.code == RC.LEADER_PENDING_FULL]
        assert len(full) == 5 and {r.request_id for r in full} == set(range(11, 16))
    finally:
        ctx.destroy(linger=0)


def test_multi_frame_is_served_request_by_request(make_cluster):
    """A MULTI of single appends (written as one batch) mixed with other requests and bad
    frames: every inner request gets its own answer, in MULTI_RESPONSE frames once the peer
    has spoken MULTI, and the appends commit at consecutive indexes."""
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    ctx, s = _raw_dealer(c, lead)
    try:
        inner = [P.encode(P.AppendRequest("default", lead, b"m%d" % i, request_id=i + 1)) for i in range(5)]
        inner.insert(2, b"\x01\x63garbage")  # unknown type: an error reply, rid unknown (0)
        inner.insert(4, P.encode(P.AppendRequest("other", lead, b"x", request_id=50)))
        inner.append(P.encode(P.MetadataRequest("default", lead, request_id=60)))
        inner.append(P.encode(P.AppendRequest("default", lead, b"last", request_id=70)))
        s.send(P.encode_multi(inner))
        replies, frames = [], 0
        while len(replies) < len(inner) and s.poll(5000):
            msg = P.decode(s.recv())
            frames += 1
            assert isinstance(msg, P.Multi) and msg.response
            replies += [P.decode(f) for f in msg.frames]
        by_rid = {r.request_id: r for r in replies}
        assert len(replies) == len(inner) and frames < len(inner)
        assert by_rid[0].code == RC.UNEXPECTED_ARGUMENT
        assert by_rid[50].code == RC.UNKNOWN_GROUP
        assert isinstance(by_rid[60], P.MetadataResponse) and by_rid[60].code == RC.SUCCESS
        appends = [by_rid[i] for i in (1, 2, 3, 4, 5, 70)]
        assert all(isinstance(r, P.AppendResponse) and r.code == RC.SUCCESS for r in appends)
        first = appends[0].index
        assert [r.index for r in appends] == list(range(first, first + 6))
    finally:
        ctx.destroy(linger=0)
    with c.client() as cl:
        assert [bytes(cl.get(first + i).body) for i in range(6)] == [b"m0", b"m1", b"m2", b"m3", b"m4",
                                                                       b"last"]


def test_every_third_push_dropped_still_converges(make_cluster):
    c = make_cluster(3, env={"DLEDGER_TEST_DROP_PUSH_EVERY": "3"}, max_push_timeout_ms=300)
    c.wait_leader(timeout=15)
    acked = {}
    with c.client(timeout=20) as cl:
        futs = [(b"d%d" % i, cl.append_async(b"d%d" % i)) for i in range(2000)]
        for b, f in futs:
            acked[f.result(timeout=60).index] = b
    c.wait_converged(timeout=30)
    assert_identical_replicas(c, acked)


def test_divergent_follower_tail_is_truncated(make_cluster):
    """An old leader with uncommitted entries of its term rejoins: they are cut, the new
    leader's entries replace them (docs/replication.md: COMPARE, then TRUNCATE)."""
    c = make_cluster(3, max_heartbeat_leak=60, max_wait_ack_ms=300)
    old = c.wait_leader(timeout=15)
    f1, f2 = [x for x in c.nodes if x != old]
    with c.client() as cl:
        base = cl.append(b"committed-before").index
    c.wait_converged()
    c.nodes[f1].kill()
    c.nodes[f2].kill()
    ctx, s = _raw_dealer(c, old)
    try:
        for i in range(5):
            s.send(P.encode(P.AppendRequest("default", old, b"orphan-%d" % i, request_id=i + 1)))
        got = [P.decode(s.recv()) for _ in range(5) if s.poll(3000)]
        assert len(got) == 5 and all(r.code == RC.WAIT_QUORUM_ACK_TIMEOUT for r in got)
    finally:
        ctx.destroy(linger=0)
    assert c.metadata(old).ledger_end_index == base + 5
    c.nodes[old].kill()
    c.nodes[f1].start()
    c.nodes[f2].start()
    new = c.wait_leader(timeout=20, among=[f1, f2])
    assert new != old
    acked = {base: b"committed-before"}
    with c.client() as cl:
        for i in range(10):
            b = b"new-%d" % i
            acked[cl.append(b).index] = b
    c.nodes[old].start()
    c.wait_converged(timeout=30)
    log = assert_identical_replicas(c, acked)
    assert not any(e[3].startswith(b"orphan") for e in log)


def test_batch_positions_match_the_store(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    bodies = [os.urandom(1 + (i * 37) % 3000) for i in range(50)]
    with c.client() as cl:
        rs = cl.append_batch(bodies)
        assert [r.index for r in rs] == list(range(rs[0].index, rs[0].index + 50))
        assert all(b.pos > a.pos for a, b in zip(rs, rs[1:], strict=False))
        for r, b in zip(rs, bodies, strict=True):
            e = cl.get(r.index)
            assert (e.body, e.pos, e.term) == (b, r.pos, r.term)


def test_bad_input_on_the_data_port(make_cluster):
    c = make_cluster(3, max_body_size=1024, max_frame_size=1 << 20)
    lead = c.wait_leader(timeout=15)
    ctx, s = _raw_dealer(c, lead)
    try:
        def ask(msg_or_frame):
            s.send(msg_or_frame if isinstance(msg_or_frame, bytes) else P.encode(msg_or_frame))
            assert s.poll(3000), "no answer"
            return P.decode(s.recv())

        assert ask(b"\x01garbage-garbage").code == RC.UNEXPECTED_ARGUMENT
        assert ask(P.AppendRequest("other", lead, b"x", request_id=2)).code == RC.UNKNOWN_GROUP
        assert ask(P.AppendRequest("default", "nobody", b"x", request_id=3)).code == RC.UNKNOWN_MEMBER
        assert ask(P.BatchAppendRequest("default", lead, [], request_id=4)).code == RC.REQUEST_WITH_EMPTY_BODYS
        r = ask(P.AppendRequest("default", lead, b"y" * 2000, request_id=5))
        assert r.code == RC.UNEXPECTED_ARGUMENT and "body" in r.reason
        s.send(b"z" * (2 << 20))  # above ZMQ_MAXMSGSIZE: libzmq drops the connection
    finally:
        ctx.destroy(linger=0)
    with c.client() as cl:  # still serving
        assert cl.append(b"after junk").index >= 0
    assert all(n.alive for n in c.nodes.values())
    assert c.metadata(lead).role == Role.LEADER


def test_sigkill_of_dispatcher_or_ack_checker_is_restored(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    node = c.nodes[lead]
    with c.client() as cl:
        cl.append(b"before")
        pids = node.role_pids()
        disp = next(k for k in pids if k.startswith("dispatcher"))
        for role in (disp, "ack_checker"):
            os.kill(pids[role], signal.SIGKILL)
            wait_for(lambda role=role: node.role_pids().get(role) not in (None, pids[role]), 5,
                     f"supervisor restarts {role}")
        for i in range(50):
            cl.append(b"after-%d" % i)
    c.wait_converged()
    assert c.leader() == lead
