"""ipc.client's read and put paths against fake nodes: pipelined queries (`query_async`,
`KVClient.get_async`), reads from a named member (`read_from`, FLAG_ANY_MEMBER), and appends
that want no result (`no_result`, FLAG_NO_RESULT: what `KVClient.put` sends)."""

from __future__ import annotations

import pytest

from ipc import protocol as P
from ipc.client import DLedgerError, KVClient, QueryResult
from ipc.codes import ResponseCode as RC
from node.statemachine import kv as K
from tests.unit.test_client import GROUP, HOLD, FakeCluster, FakeNode, client, make_cluster  # noqa: F401


def answer_queries(node: FakeNode, msg: P.Message) -> list[P.Message] | None:
    """A state machine that answers a query with its request reversed, at applied index 7."""
    if isinstance(msg, P.QueryRequest):
        return [P.QueryResponse(RC.SUCCESS, GROUP, 1, "n0", 7, bytes(msg.request)[::-1], msg.request_id)]
    return None


def kv_node(node: FakeNode, msg: P.Message) -> list[P.Message] | None:
    """A KV leader: every key holds b"v:" + key at revision 5; appends answered by the cluster."""
    if isinstance(msg, P.QueryRequest):
        key = bytes(msg.request)[K._KEY_HDR.size:]
        reply = K.encode_query_reply(K.Status.OK, 9, [K.KeyValue(key, b"v:" + key, 5, 5, 1)])
        return [P.QueryResponse(RC.SUCCESS, GROUP, 1, "n0", 9, reply, msg.request_id)]
    return None


def test_query_async_pipelines_many_queries_on_one_client(make_cluster) -> None:  # noqa: F811
    cl = make_cluster()
    n0 = cl.nodes["n0"]
    n0.script = lambda node, msg: HOLD if isinstance(msg, P.QueryRequest) else None
    orig = cl.behave
    cl.behave = lambda node, msg: answer_queries(node, msg) or orig(node, msg)  # serves the held ones
    with client(cl) as c:
        futs = [c.query_async(b"q%03d" % i) for i in range(50)]
        n0.wait_for(lambda n: n.count(P.QueryRequest) == 50)  # all 50 in flight at once
        n0.release_held.set()
        got = [f.result(5) for f in futs]
    assert got == [QueryResult((b"q%03d" % i)[::-1], 7) for i in range(50)]


def test_a_query_read_from_a_named_member_carries_the_flag_and_is_not_retried_elsewhere(make_cluster) -> None:  # noqa: F811
    cl = make_cluster()
    n0, n1 = cl.nodes["n0"], cl.nodes["n1"]
    n1.script = answer_queries
    with client(cl) as c:
        assert c.query(b"abc", read_from="n1") == QueryResult(b"cba", 7)
        (q,) = [m for m in n1.received if isinstance(m, P.QueryRequest)]
        assert q.any_member is True and q.remote_id == "n1"
        n0.script = answer_queries
        assert c.query(b"abc") == QueryResult(b"cba", 7)  # to the leader, without the flag
        assert [m.any_member for m in n0.received if isinstance(m, P.QueryRequest)] == [False]
        n1.script = None  # a follower without the fake's state machine: NOT_LEADER
        with pytest.raises(DLedgerError) as ei:
            c.query(b"abc", read_from="n1")
        assert ei.value.code == RC.NOT_LEADER
        assert n0.count(P.QueryRequest) == 1, "a read from a named member was sent elsewhere"
        with pytest.raises(DLedgerError) as ei:
            c.query(b"abc", read_from="n9")
        assert ei.value.code == RC.UNKNOWN_MEMBER


def test_kv_put_wants_no_result_while_cas_and_delete_do(make_cluster) -> None:  # noqa: F811
    cl = make_cluster()
    n0 = cl.nodes["n0"]
    kv = KVClient(cl.peers, GROUP, timeout=3.0, attempt_timeout=0.3, sessions=False)
    try:
        assert kv.put(b"k", b"v") == 0  # no result came back: the revision is the index
        with pytest.raises(Exception):  # noqa: B017 - the fake has no results: outcome unknown
            kv.cas(b"k", b"v", b"w")
        appends = [m for m in n0.received if isinstance(m, P.AppendRequest)]
        assert [a.no_result for a in appends] == [True, False]
        with kv.client as c:
            c.append(b"plain")
        assert [m.no_result for m in n0.received if isinstance(m, P.AppendRequest)][-1] is False
    finally:
        kv.close()


def test_kv_get_async_resolves_to_what_get_returns(make_cluster) -> None:  # noqa: F811
    cl = make_cluster()
    cl.nodes["n0"].script = kv_node
    cl.nodes["n2"].script = kv_node
    with KVClient(cl.peers, GROUP, timeout=3.0, attempt_timeout=0.3, sessions=False) as kv:
        futs = [kv.get_async(b"k%d" % i) for i in range(20)]
        got = [f.result(5) for f in futs]
        assert [(g.key, g.value, g.revision) for g in got] == [(b"k%d" % i, b"v:k%d" % i, 5) for i in range(20)]
        assert kv.get(b"x", read_from="n2").value == b"v:x"
        assert [m.any_member for m in cl.nodes["n2"].received if isinstance(m, P.QueryRequest)] == [True]
        with pytest.raises(DLedgerError):
            kv.get_async(b"x", read_from="n1").result(5)  # n1 answers NOT_LEADER


def test_a_named_member_that_is_starting_is_asked_again_within_the_timeout(make_cluster) -> None:  # noqa: F811
    """A node starts its applier last: until then it answers a query LEADER_PENDING_FULL ("the
    applier is not taking requests"). A read is idempotent, so a read from that named node is
    asked again until it answers, within the call's timeout, and never sent elsewhere; one that
    stays busy fails with that code once the timeout is spent."""
    cl = make_cluster()
    n0, n1 = cl.nodes["n0"], cl.nodes["n1"]

    def starting(node, msg):
        if isinstance(msg, P.QueryRequest) and node.count(P.QueryRequest) <= 3:
            return [cl.error(msg, RC.LEADER_PENDING_FULL)]
        return answer_queries(node, msg)

    n1.script = starting
    with client(cl) as c:
        assert c.query(b"abc", read_from="n1") == QueryResult(b"cba", 7)
        assert n1.count(P.QueryRequest) == 4 and n0.count(P.QueryRequest) == 0
        n1.script = lambda node, msg: [cl.error(msg, RC.LEADER_PENDING_FULL)] if isinstance(
            msg, P.QueryRequest) else None
        with pytest.raises(DLedgerError) as ei:
            c.query(b"abc", read_from="n1", timeout=0.5)
        assert ei.value.code == RC.LEADER_PENDING_FULL
        assert n0.count(P.QueryRequest) == 0


def test_earliest_skips_members_with_an_empty_log():
    """"earliest" is the lowest first index a member holds: a member whose log is empty (begin
    -1: new, or back from a lost disk) holds nothing, so it must not pull "earliest" down to 0
    below a begin that retention moved (a follow from 0 would be refused). The same rule serves
    `resolve_index`, the Spark source's group range and `dledger backup`."""
    from types import SimpleNamespace

    from ipc.client import DLedgerClient
    from ipc.client.results import Metadata, NodeInfo

    def node(nid, begin, alive=True):
        return NodeInfo(nid, "127.0.0.1:1", "FOLLOWER", 3, "n0", begin, 900, 899, alive)

    md = Metadata("g", "n0", 3, [node("n0", 500), node("n1", -1), node("n2", 480, alive=False)])
    assert md.lowest_begin() == 500
    stub = SimpleNamespace(timeout=1.0, metadata=lambda timeout=None: md)
    assert DLedgerClient.resolve_index(stub, "earliest") == 500
    empty = Metadata("g", "n0", 3, [node("n0", -1), node("n1", -1)])
    assert empty.lowest_begin() == 0
