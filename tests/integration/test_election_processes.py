"""Leader election with real processes (docs/election.md): exactly one leader, fast failover, rejoin,
pause/resume, durable votes, majority loss, role restarts, garbage on the ports."""

import os
import signal
import socket
import time

import pytest
import zmq
from cluster import process_cpu_seconds, wait_for

from ipc import protocol as P
from ipc.codes import ResponseCode, Role
from node.store.term_vote import TermVoteFile


@pytest.mark.parametrize("n", [1, 3, 5])
def test_group_elects_exactly_one_leader(make_cluster, n):
    c = make_cluster(n)
    mon = c.start_monitor()
    lead = c.wait_leader(timeout=15)
    views = c.views()
    assert sum(1 for v in views.values() if v and v.role == Role.LEADER) == 1
    assert len({v.term for v in views.values()}) == 1
    assert all(v.leader_id == lead for v in views.values())
    mon.stop()
    assert not mon.violations()


def test_sigkill_leader_new_leader_fast_and_old_rejoins(make_cluster):
    c = make_cluster(3)
    mon = c.start_monitor()
    old = c.wait_leader(timeout=15)
    old_term = c.term_of(old)
    # As in the SIGSTOP test below: a member that started after the first election votes only
    # once it holds the leader's NOOP; killing the only leader before that leaves one vote
    # (seen under load: both survivors CANDIDATE in term 1 for the whole wait).
    c.wait_converged(timeout=15)
    t0 = time.monotonic()
    c.nodes[old].kill()
    others = [x for x in c.nodes if x != old]
    new = c.wait_leader(timeout=10, among=others)
    failover = time.monotonic() - t0
    assert new != old
    assert c.term_of(new) > old_term
    # 1.5 s is the product's bound; CI machines are noisy, so the test allows headroom and the
    # measured figures live in docs/election.md (benchmarks report speed, tests behaviour).
    assert failover < 5.0, failover
    c.nodes[old].start()
    wait_for(lambda: (m := c.metadata(old)) and m.role == Role.FOLLOWER and m.leader_id == new
             and m.term == c.term_of(new), 10, "old leader rejoins as follower in the new term")
    mon.stop()
    assert not mon.violations()


def test_sigstop_leader_others_elect_and_old_steps_down_on_sigcont(make_cluster):
    c = make_cluster(3)
    mon = c.start_monitor()
    old = c.wait_leader(timeout=15)
    # Every member holds the leader's NOOP before the leader stops. A member that started after
    # the first election cannot tell itself from one that lost its disk: it votes only once it
    # holds what the group had when it asked (docs/election.md "Non-voting members"); stopping
    # the only leader before that leaves two live members and one vote.
    c.wait_converged(timeout=15)
    c.nodes[old].signal(signal.SIGSTOP)
    others = [x for x in c.nodes if x != old]
    new = c.wait_leader(timeout=10, among=others)
    c.nodes[old].signal(signal.SIGCONT)
    wait_for(lambda: c.leader() == new, 10, "resumed old leader steps down, all agree on the new one")
    mon.stop()
    assert not mon.violations(), mon.violations()


def test_losing_the_majority_makes_the_leader_step_down(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    for nid in c.nodes:
        if nid != lead:
            c.nodes[nid].kill()
    wait_for(lambda: (m := c.metadata(lead)) and m.role != Role.LEADER, 5,
             "isolated leader steps down (no heartbeat quorum for leak x interval)")


def test_restarted_follower_keeps_term_and_vote(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    f = next(x for x in c.nodes if x != lead)
    term = c.term_of(f)
    c.nodes[f].kill()
    tv = TermVoteFile(c.nodes[f].store_dir).load()
    assert tv.term == term  # durable before it was acted on
    c.nodes[f].start()
    # back in (at least) its term; under load it may even have won a later election meanwhile
    wait_for(lambda: (m := c.metadata(f)) and m.term >= term and m.role in (Role.FOLLOWER, Role.LEADER), 30,
             "restarted follower back in (at least) its persisted term")


def test_group_restarted_as_a_whole_elects_in_a_new_term(make_cluster):
    """Seen before: a 3-node group stopped and restarted came back with the same leader in the
    same term (its vote for itself was on disk, its voters accepted it again). A node must never
    lead twice in one term: its log may have lost a tail it had already sent."""
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    term = c.term_of(lead)
    for node in c.nodes.values():
        assert node.stop() == 0
    mon = c.start_monitor()
    for node in c.nodes.values():
        node.start()
    new = c.wait_leader(timeout=15)
    assert c.term_of(new) > term, (lead, term, new, c.term_of(new))
    mon.stop()
    assert not mon.violations()


def test_node_never_votes_twice_in_a_term_across_a_crash(make_cluster, tmp_path):
    """Crash right after voting, then a second candidate asks in the same term: rejected."""
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    voter = next(x for x in c.nodes if x != lead)
    other = next(x for x in c.nodes if x not in (lead, voter))
    c.nodes[lead].kill()
    c.nodes[other].kill()
    c.nodes[voter].kill()
    tv = TermVoteFile(c.nodes[voter].store_dir).load()
    # Put the voter's durable state at "voted for `other` in term T+5", as if it crashed
    # right after granting that vote.
    t = tv.term + 5
    TermVoteFile(c.nodes[voter].store_dir).save(t, other)
    c.nodes[voter].start()
    wait_for(lambda: c.metadata(voter), 10, "voter back up")
    # A different candidate (lead's id) asks for a vote in term t with a log as long as anyone's.
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(f"tcp://127.0.0.1:{c.nodes[voter].port + 1}")
        s.send(P.encode(P.VoteRequest("default", voter, lead, t, 10**6, 10**6, request_id=7)))
        assert s.poll(3000), "no vote response"
        r = P.decode(s.recv())
    finally:
        s.close()
        ctx.destroy(linger=0)
    assert isinstance(r, P.VoteResponse)
    assert r.vote_result != 1, "granted a second vote in the same term"  # 1 == ACCEPT
    assert TermVoteFile(c.nodes[voter].store_dir).load().voted_for == other


def test_sigkill_of_a_role_process_is_restored(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    node = c.nodes[lead]
    pids = node.role_pids()
    assert {"elector", "handler"} <= set(pids), pids
    term = c.term_of(lead)
    os.kill(pids["handler"], signal.SIGKILL)
    wait_for(lambda: node.role_pids().get("handler") not in (None, pids["handler"]), 5,
             "supervisor restarts the handler")
    wait_for(lambda: c.metadata(lead), 5, "restarted handler answers")
    os.kill(pids["elector"], signal.SIGKILL)
    wait_for(lambda: node.role_pids().get("elector") not in (None, pids["elector"]), 5,
             "supervisor restarts the elector")
    lead2 = c.wait_leader(timeout=10)
    assert c.term_of(lead2) >= term
    assert node.alive


def test_garbage_on_both_ports_leaves_every_node_up(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    junk = [b"", b"\x00", b"\x01" * 13, os.urandom(200), b"GET / HTTP/1.1\r\n\r\n",
            P.encode(P.MetadataRequest("other-group", "n0")), P.encode(P.MetadataRequest("default", "zz"))]
    ctx = zmq.Context()
    try:
        for node in c.nodes.values():
            for port in (node.port, node.port + 1):
                d = ctx.socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 0)
                d.connect(f"tcp://127.0.0.1:{port}")
                for j in junk:
                    d.send(j)
                d.send_multipart([b"a", b"b", b"c"])
                d.close()
                with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
                    raw.sendall(os.urandom(512))  # not even ZMTP
    finally:
        ctx.destroy(linger=0)
    # wrong group / unknown member get a clear code, not silence
    r = c.request("n0", P.MetadataRequest("other-group", "n0", request_id=9))
    assert r is not None and r.code == ResponseCode.UNKNOWN_GROUP and r.request_id == 9
    r = c.request("n0", P.MetadataRequest("default", "zz", request_id=10))
    assert r is not None and r.code == ResponseCode.UNKNOWN_MEMBER
    assert all(n.alive for n in c.nodes.values())
    c.wait_leader(timeout=10)


def test_idle_group_uses_little_cpu(make_cluster):
    """Event-driven loops, no spinning: in an idle 3-node group no process uses 10% of one
    core, and all of them together less than 30% (CPU time over a 5 s window). A role that
    polls every millisecond costs 20-100% of a core; the busiest idle role, the leader's
    elector with its heartbeats, costs about 1.5% on a quiet machine and 2.5-4% on a busy one
    (the same wake-ups cost more there). What idle costs is measured by a benchmark
    (tools/bench/idle_cpu.py, docs/performance.md "Idle cost"), not asserted here."""
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    c.wait_converged(timeout=10)  # the NOOP is committed everywhere: nothing left to do
    nodes = list(c.nodes.values())
    # Roles start in stages (handler, elector, then the rest): the window opens once every
    # role of every node has started and the handler's deferred imports are done, so it
    # measures the idle loops, not interpreters starting.
    wait_for(lambda: all(n.log_text().count(" started ") >= 5 for n in nodes), 30, "every role started")
    procs = {f"{n.id} {role}": pid for n in nodes for role, pid in {**n.role_pids(), "supervisor": n.proc.pid}.items()}
    cpu0, t0 = {k: process_cpu_seconds(pid) for k, pid in procs.items()}, time.monotonic()
    wait_for(lambda: time.monotonic() - t0 >= 5, 10, "a 5 s idle window")
    wall = time.monotonic() - t0
    pct = {k: (process_cpu_seconds(pid) - cpu0[k]) / wall * 100 for k, pid in procs.items()}
    busiest = max(pct, key=pct.get)
    assert pct[busiest] < 10.0, f"{busiest} used {pct[busiest]:.1f}% of one core while idle: {pct}"
    assert sum(pct.values()) < 30.0, f"idle group used {sum(pct.values()):.1f}% of one core: {pct}"


def test_no_leader_change_while_busy(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    mon = c.start_monitor(interval=0.1)
    t0 = time.monotonic()
    n = 0
    with c.client() as cl:
        while time.monotonic() - t0 < 15:
            futs = [cl.append_async(b"busy-%d" % i) for i in range(200)]
            n += len([f.result(timeout=30) for f in futs])
    mon.stop()
    assert n > 1000
    assert c.leader() == lead and mon.leader_changes == 1, mon.leaders_by_term
