"""ipc.client against fake nodes: redirects, retries, definite vs indeterminate outcomes
(docs/client.md "Errors"), pipelining, thread safety, GET decoding, METADATA gathering and the CLI
commands built on the client (their public names and outputs: docs/client.md).

A fake node is a thread with its own ZeroMQ context and a ROUTER on 127.0.0.1 that decodes
requests with ipc.protocol and answers from a scripted behaviour. Tests wait on conditions with
deadlines, never on sleeps, and stop every fake node and client in `finally`/fixtures.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable

import pytest
import zmq

from ipc import protocol as P
from ipc.client import (
    AppendResult,
    DLedgerClient,
    DLedgerError,
    DLedgerIndeterminateError,
)
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.store import codec
from tools import cli

GROUP = "default"
HOLD: list[P.Message] = []  # a script's answer meaning: answer later, when `release_held` is set
Script = Callable[["FakeNode", P.Message], list[P.Message] | None]


class FakeNode:
    """One fake data port. `script(node, msg)` may return replies (a list, [] = stay silent) or
    None to fall back to the cluster's default behaviour."""

    def __init__(self, node_id: str, cluster: FakeCluster, port: int | None = None) -> None:
        self.id = node_id
        self.cluster = cluster
        self.script: Script | None = None
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if port is None:
            self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        else:  # a node that was down comes up where its members expect it
            self.sock.bind(f"tcp://127.0.0.1:{port}")
            self.port = port
        self.received: list[P.Message] = []
        self.idents: list[bytes] = []  # the ROUTER identity of each sender (a new DEALER = new one)
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self.held: list[tuple[bytes, P.Message]] = []
        self.multis = 0  # MULTI frames received
        self.release_held = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"fake-{node_id}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if self.held and self.release_held.is_set():
                for ident, msg in self.held:
                    for r in self.cluster.behave(self, msg):
                        self.sock.send_multipart([ident, P.encode(r)])
                self.held.clear()
            if not poller.poll(20):
                continue
            while True:
                try:
                    ident, frame = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                msg = P.decode(frame)
                if isinstance(msg, P.Multi):  # like a node: serve each, answer in one MULTI
                    self.multis += 1
                    out = [P.encode(r) for m in map(P.decode, msg.frames) for r in self._serve(ident, m)]
                    if out:
                        self.sock.send_multipart([ident, P.encode_multi(out, response=True)])
                    continue
                for r in self._serve(ident, msg):
                    self.sock.send_multipart([ident, P.encode(r)])

    def _serve(self, ident: bytes, msg: P.Message) -> list[P.Message]:
        with self.cond:
            self.received.append(msg)
            self.idents.append(ident)
            self.cond.notify_all()
        replies = self.script(self, msg) if self.script else None
        if replies is HOLD:
            self.held.append((ident, msg))
            return []
        if replies is None:
            replies = self.cluster.behave(self, msg)
        return replies

    def count(self, cls: type) -> int:
        with self.cond:
            return sum(1 for m in self.received if type(m) is cls)

    def wait_for(self, pred: Callable[[FakeNode], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self):
                left = deadline - time.monotonic()
                assert left > 0, f"condition not met on {self.id} within {timeout}s"
                self.cond.wait(left)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sock.close(linger=0)
        self.ctx.term()


def free_port() -> int:
    """A port with nothing listening (a node that is down)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    s.close()
    ctx.term()
    return port


class FakeCluster:
    """The shared truth of the fake group: who leads, the term and the (all committed) log."""

    def __init__(self, ids: list[str], down: tuple[str, ...] = ()) -> None:
        self.lock = threading.Lock()
        self.leader: str | None = ids[0]
        self.term = 1
        self.entries: list[bytes] = []  # store-format entries, all committed
        self.pos = 0
        self.get_cap = 1 << 30  # max entries per GET answer (a node caps bytes per answer)
        self.nodes: dict[str, FakeNode] = {}
        self.ports: dict[str, int] = {}
        try:
            for i in ids:
                if i in down:
                    self.ports[i] = free_port()
                else:
                    self.nodes[i] = FakeNode(i, self)
                    self.ports[i] = self.nodes[i].port
        except BaseException:
            self.stop()
            raise

    @property
    def peers(self) -> str:
        return ";".join(f"{i}-127.0.0.1:{p}" for i, p in self.ports.items())

    def stop(self) -> None:
        for n in self.nodes.values():
            n.stop()

    def store(self, body: bytes, magic: int = codec.MAGIC_NORMAL, term: int | None = None) -> tuple[int, int]:
        with self.lock:
            index, pos = len(self.entries), self.pos
            e = codec.encode_entry(index, self.term if term is None else term, pos, body, magic)
            self.entries.append(e)
            self.pos += len(e)
            return index, pos

    def error(self, msg: P.Message, code: int, leader: str | None = None) -> P.ErrorResponse:
        return P.error_reply(msg, code, group=GROUP, term=self.term,
                             leader_id=self.leader or "" if leader is None else leader)

    def behave(self, node: FakeNode, msg: P.Message) -> list[P.Message]:
        if msg.group != GROUP:
            return [self.error(msg, RC.UNKNOWN_GROUP)]
        if msg.remote_id != node.id:
            return [self.error(msg, RC.UNKNOWN_MEMBER)]
        rid = msg.request_id
        if isinstance(msg, P.MetadataRequest):
            role = Role.LEADER if node.id == self.leader else Role.FOLLOWER
            return [P.MetadataResponse(RC.SUCCESS, GROUP, self.term, self.leader or "", node.id, role,
                                       0 if self.entries else -1, len(self.entries) - 1,
                                       len(self.entries) - 1, [], rid)]
        if node.id != self.leader:
            return [self.error(msg, RC.NOT_LEADER)]
        if isinstance(msg, P.AppendRequest):
            index, pos = self.store(bytes(msg.body))
            return [P.AppendResponse(RC.SUCCESS, GROUP, self.term, node.id, index, pos, rid)]
        if isinstance(msg, P.BatchAppendRequest):
            got = [self.store(bytes(b)) for b in msg.bodies]
            return [P.BatchAppendResponse(RC.SUCCESS, GROUP, self.term, node.id, got[0][0],
                                          [p for _i, p in got], rid)]
        if isinstance(msg, P.GetRequest):
            if not 0 <= msg.index < len(self.entries):
                return [self.error(msg, RC.INDEX_OUT_OF_RANGE)]
            blob = b"".join(self.entries[msg.index:msg.index + min(msg.count, self.get_cap)])
            return [P.GetResponse(RC.SUCCESS, GROUP, self.term, node.id, blob, rid)]
        if isinstance(msg, P.LeadershipTransferRequest):
            if msg.term != self.term:
                return [self.error(msg, RC.INCONSISTENT_TERM)]
            self.leader, self.term = msg.transferee_id, self.term + 1
            return [P.TransferResponse(RC.SUCCESS, GROUP, self.term, self.leader, rid)]
        return [self.error(msg, RC.UNSUPPORTED)]


@pytest.fixture
def make_cluster():
    made: list[FakeCluster] = []

    def make(ids: list[str] | None = None, down: tuple[str, ...] = ()) -> FakeCluster:
        c = FakeCluster(ids or ["n0", "n1", "n2"], down)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.stop()


def client(cluster: FakeCluster, **kw) -> DLedgerClient:
    kw.setdefault("timeout", 3.0)
    kw.setdefault("attempt_timeout", 0.3)
    kw.setdefault("sessions", False)  # sessions have their own tests (test_client_sessions.py)
    return DLedgerClient(cluster.peers, GROUP, **kw)


def io_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dledger-client-io"]


@pytest.fixture(autouse=True)
def no_leftover_client_threads():
    yield
    assert io_threads() == []


# ------------------------------------------------------------------------------------ appends


def test_append_finds_leader_and_roundtrips(make_cluster):
    cl = make_cluster()
    cl.leader = "n1"
    with client(cl) as c:
        r = c.append(b"hello")
        assert r == AppendResult(0, 1, 0)
        r2 = c.append(b"world")
        assert r2.index == 1 and r2.pos == 48 + 5
    assert cl.nodes["n0"].count(P.AppendRequest) == 0  # discovery, not trial and error
    assert cl.nodes["n1"].count(P.AppendRequest) == 2


def test_redirect_on_not_leader(make_cluster):
    """n0 still claims leadership (stale) but answers NOT_LEADER naming n1: follow it."""
    cl = make_cluster(["n0", "n1"])
    cl.leader = "n1"
    n0, n1 = cl.nodes["n0"], cl.nodes["n1"]

    def stale_leader(node, msg):
        if isinstance(msg, P.MetadataRequest):
            return [P.MetadataResponse(RC.SUCCESS, GROUP, 1, "n0", "n0", Role.LEADER,
                                       request_id=msg.request_id)]
        return None

    n0.script = stale_leader
    n1.script = lambda node, msg: [] if isinstance(msg, P.MetadataRequest) else None
    with client(cl) as c:
        assert c.append(b"x").index == 0
        # Usually once; twice when the first send to n1 found its connection not yet up
        # (IMMEDIATE: nothing sent, the leader forgotten, n0 asked again). Seen once in CI
        # on a loaded machine. What matters: once redirected, the next append goes to n1.
        redirected = n0.count(P.AppendRequest)
        assert redirected >= 1
        assert c.append(b"y").index == 1  # the redirect is remembered
    assert n0.count(P.AppendRequest) == redirected
    assert n1.count(P.AppendRequest) == 2


def test_pending_full_is_retried_within_timeout(make_cluster):
    cl = make_cluster()
    n0 = cl.nodes["n0"]
    fulls = [3]

    def busy(node, msg):
        if isinstance(msg, P.AppendRequest) and fulls[0] > 0:
            fulls[0] -= 1
            return [cl.error(msg, RC.LEADER_PENDING_FULL)]
        return None

    n0.script = busy
    with client(cl) as c:
        assert c.append(b"x").index == 0
    assert n0.count(P.AppendRequest) == 4
    assert len(cl.entries) == 1


def test_pending_full_until_timeout_is_definite(make_cluster):
    cl = make_cluster(["n0"])
    cl.nodes["n0"].script = (lambda node, msg: [cl.error(msg, RC.LEADER_PENDING_FULL)]
                             if isinstance(msg, P.AppendRequest) else None)
    with client(cl, timeout=0.4) as c, pytest.raises(DLedgerError) as ei:
        c.append(b"x")
    assert ei.value.code == RC.LEADER_PENDING_FULL
    assert not ei.value.indeterminate
    assert not isinstance(ei.value, DLedgerIndeterminateError)


@pytest.mark.parametrize("code", [RC.WAIT_QUORUM_ACK_TIMEOUT, RC.TERM_CHANGED])
def test_indeterminate_codes_are_not_resent(make_cluster, code):
    cl = make_cluster()
    n0 = cl.nodes["n0"]

    def unsure(node, msg):
        if isinstance(msg, P.AppendRequest):
            return [P.AppendResponse(code, GROUP, 1, "n0", request_id=msg.request_id)]
        if isinstance(msg, P.BatchAppendRequest):
            return [P.BatchAppendResponse(code, GROUP, 1, "n0", request_id=msg.request_id)]
        return None

    n0.script = unsure
    with client(cl) as c:
        with pytest.raises(DLedgerIndeterminateError) as ei:
            c.append(b"x")
        e = ei.value
        assert e.code == code and e.name == code.name and e.indeterminate
        assert "may still be committed" in str(e)
        with pytest.raises(DLedgerIndeterminateError):
            c.append_batch([b"a", b"b"])
    assert n0.count(P.AppendRequest) == 1
    assert n0.count(P.BatchAppendRequest) == 1
    assert all(n.count(P.AppendRequest) == 0 for n in (cl.nodes["n1"], cl.nodes["n2"]))


def test_timeout_after_send_is_indeterminate_and_not_resent(make_cluster):
    cl = make_cluster()
    n0 = cl.nodes["n0"]
    n0.script = lambda node, msg: [] if isinstance(msg, P.AppendRequest) else None  # swallows
    with client(cl, timeout=0.5) as c:
        t0 = time.monotonic()
        with pytest.raises(DLedgerIndeterminateError) as ei:
            c.append(b"x")
        assert time.monotonic() - t0 < 2.0
    assert ei.value.code == RC.TIMEOUT == 300 and ei.value.indeterminate
    assert n0.count(P.AppendRequest) == 1
    assert sum(n.count(P.AppendRequest) for n in cl.nodes.values()) == 1


def test_stalled_leader_is_not_used_again_until_a_new_one_is_elected(make_cluster):
    """After an append timed out at n0, followers that still name n0 (election not over) are
    not believed: the next append waits for the new leader instead of going to n0 again."""
    cl = make_cluster()
    n0, n1 = cl.nodes["n0"], cl.nodes["n1"]
    n0.script = lambda node, msg: [] if isinstance(msg, P.AppendRequest) else None
    with client(cl) as c:
        with pytest.raises(DLedgerIndeterminateError):
            c.append(b"lost?", timeout=0.5)
        n0.script = lambda node, msg: []  # now stalled altogether: accepts frames, never answers
        base = n1.count(P.MetadataRequest)

        def elect_later(node, msg):
            if isinstance(msg, P.MetadataRequest) and node.count(P.MetadataRequest) >= base + 3:
                cl.leader, cl.term = "n1", 2
            return None

        n1.script = elect_later
        r = c.append(b"ok")
    assert (r.index, r.term) == (0, 2)
    assert n0.count(P.AppendRequest) == 1
    assert len(set(n0.idents)) >= 2  # Lazy Pirate: the DEALER to n0 was recreated
    assert n1.count(P.AppendRequest) == 1


def test_unreachable_nodes_before_send_are_retried(make_cluster):
    """n0 and n2 are down (nothing listens): nothing is sent to them, so no indeterminacy."""
    cl = make_cluster(["n0", "n1", "n2"], down=("n0", "n2"))
    cl.leader = "n1"
    with client(cl) as c:
        assert c.append(b"x").index == 0


def test_a_leader_that_comes_up_late_gets_the_parked_calls(make_cluster):
    """The followers name n0 as leader while nothing listens on n0 yet: every send there fails
    at once (no connection), the leader is forgotten and the call parked, and the next answer
    names n0 again, often while a discovery round is only scheduled. A call parked then must
    go out when n0 is named, not sit until its deadline with the leader known (what the
    integration suite saw as "no reachable leader found" right after a group elected one)."""
    cl = make_cluster(["n0", "n1", "n2"], down=("n0",))

    def answer_late(node, msg):  # n2's answer lands after the call was parked again
        if isinstance(msg, P.MetadataRequest):
            time.sleep(0.02)
        return None

    cl.nodes["n2"].script = answer_late
    with client(cl, timeout=20.0) as c:
        futures = [c.append_async(b"x%d" % i) for i in range(20)]
        for n in ("n1", "n2"):  # many rounds named the unreachable leader, and rounds go on
            cl.nodes[n].wait_for(lambda node: node.count(P.MetadataRequest) >= 20, timeout=10)
        cl.nodes["n0"] = FakeNode("n0", cl, port=cl.ports["n0"])
        t0 = time.monotonic()
        assert sorted(f.result(20).index for f in futures) == list(range(20))
        assert time.monotonic() - t0 < 10.0  # sent once n0 answers, not at the 20 s deadline


def test_no_leader_yet_then_elected(make_cluster):
    cl = make_cluster()
    cl.leader = None
    n1 = cl.nodes["n1"]

    def elect_after_three_asks(node, msg):
        if isinstance(msg, P.MetadataRequest) and node.count(P.MetadataRequest) >= 3:
            cl.leader = "n1"
        return None

    n1.script = elect_after_three_asks
    with client(cl) as c:
        assert c.append(b"x").index == 0
    assert n1.count(P.AppendRequest) == 1


def test_definite_error_unknown_group(make_cluster):
    cl = make_cluster()
    with DLedgerClient(cl.peers, "other", timeout=3.0, attempt_timeout=0.3) as c:
        t0 = time.monotonic()
        with pytest.raises(DLedgerError) as ei:
            c.append(b"x")
        assert time.monotonic() - t0 < 2.0  # reported, not hidden behind a timeout
        assert ei.value.code == RC.UNKNOWN_GROUP and not ei.value.indeterminate
        with pytest.raises(DLedgerError) as ei:
            c.metadata()
        assert ei.value.code == RC.UNKNOWN_GROUP
    assert len(cl.entries) == 0


def test_definite_error_from_leader_is_not_retried(make_cluster):
    cl = make_cluster()
    n0 = cl.nodes["n0"]
    n0.script = (lambda node, msg: [cl.error(msg, RC.DISK_FULL)]
                 if isinstance(msg, P.AppendRequest) else None)
    with client(cl) as c, pytest.raises(DLedgerError) as ei:
        c.append(b"x")
    assert ei.value.code == RC.DISK_FULL and not ei.value.indeterminate
    assert n0.count(P.AppendRequest) == 1


def test_append_batch_positions(make_cluster):
    cl = make_cluster()
    with client(cl) as c:
        c.append(b"first")
        rs = c.append_batch([b"a", b"bb", b"ccc"])
        with pytest.raises(DLedgerError) as ei:
            c.append_batch([])
        assert ei.value.code == RC.REQUEST_WITH_EMPTY_BODYS
    p0 = 48 + 5
    assert rs == [AppendResult(1, 1, p0), AppendResult(2, 1, p0 + 49), AppendResult(3, 1, p0 + 49 + 50)]
    assert cl.nodes["n0"].count(P.BatchAppendRequest) == 1


def test_pipelined_async_appends_resolve_in_order(make_cluster):
    cl = make_cluster()
    n = 2000
    with client(cl, timeout=10.0) as c:
        futs = [c.append_async(b"m%d" % i) for i in range(n)]
        results = [f.result(15) for f in futs]
    assert [r.index for r in results] == list(range(n))
    assert len({r.pos for r in results}) == n
    assert [bytes(codec.decode_entry(e).body) for e in cl.entries] == [b"m%d" % i for i in range(n)]
    # A burst of submissions travels as MULTI frames (answered in MULTI_RESPONSEs), not 2000.
    assert 0 < cl.nodes["n0"].multis < n


def test_many_in_flight_with_small_window(make_cluster):
    """max_in_flight is backpressure: submissions block, nothing fails."""
    cl = make_cluster(["n0"])
    with client(cl, max_in_flight=8) as c:
        futs = [c.append_async(b"%d" % i) for i in range(300)]
        assert [f.result(10).index for f in futs] == list(range(300))


def test_blocked_submitter_gets_a_freed_slot(make_cluster):
    """Backpressure never starves: one completion in a full window lets a blocked caller in."""
    cl = make_cluster(["n0"])
    n0 = cl.nodes["n0"]

    def script(node, msg):
        if isinstance(msg, P.AppendRequest):
            return [] if bytes(msg.body) == b"stuck" else HOLD
        return None

    n0.script = script
    with client(cl, max_in_flight=8, timeout=10.0) as c:
        stuck = [c.append_async(b"stuck") for _ in range(7)]
        held = c.append_async(b"held")
        n0.wait_for(lambda n: n.count(P.AppendRequest) == 8)
        box: list = []
        t = threading.Thread(target=lambda: box.append(c.append_async(b"next")))
        t.start()
        try:
            deadline = time.monotonic() + 5
            while c._slots.waiters == 0:  # the submitter is blocked on the full window
                assert time.monotonic() < deadline
                t.join(0.005)
            n0.script = None
            n0.release_held.set()
            assert held.result(5).index == 0
            t.join(5)
            assert not t.is_alive()
            assert box[0].result(5).index == 1
        finally:
            t.join(5)
        assert not any(f.done() for f in stuck)


def test_eight_threads_share_one_client(make_cluster):
    cl = make_cluster()
    per = 250
    got: dict[int, list[AppendResult]] = {}
    errors: list[BaseException] = []

    with client(cl, timeout=10.0) as c:
        def worker(k: int) -> None:
            try:
                got[k] = [c.append(b"t%d-%d" % (k, i)) for i in range(per)]
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
    assert not errors
    indexes = sorted(r.index for rs in got.values() for r in rs)
    assert indexes == list(range(8 * per))
    by_index = {codec.decode_entry(e).index: bytes(codec.decode_entry(e).body) for e in cl.entries}
    for k, rs in got.items():
        assert [by_index[r.index] for r in rs] == [b"t%d-%d" % (k, i) for i in range(per)]
        assert [r.index for r in rs] == sorted(r.index for r in rs)  # one thread: in order


# ------------------------------------------------------------------------------------ reads


def test_get_and_get_range_decode_noop_and_normal(make_cluster):
    cl = make_cluster()
    cl.store(b"", magic=codec.MAGIC_NOOP)  # a new leader's no-op
    for i in range(4):
        cl.store(b"v%d" % i)
    cl.leader = "n2"
    with client(cl) as c:
        e0 = c.get(0)
        assert (e0.index, e0.term, e0.pos, e0.body, e0.type) == (0, 1, 0, b"", "NOOP")
        e2 = c.get(2)
        assert (e2.index, e2.body, e2.type) == (2, b"v1", "NORMAL")
        assert e2.pos == 48 + 50
        es = c.get_range(0, 100)  # fewer at the committed end
        assert [e.index for e in es] == [0, 1, 2, 3, 4]
        assert [e.type for e in es] == ["NOOP"] + ["NORMAL"] * 4
        assert [e.body for e in es[1:]] == [b"v0", b"v1", b"v2", b"v3"]
        assert [e.index for e in c.get_range(3, 1)] == [3]
        cl.get_cap = 2  # the node answers at most 2 per request: the client keeps asking
        assert [e.index for e in c.get_range(0, 5)] == [0, 1, 2, 3, 4]
        assert [e.index for e in c.get_range(1, 3)] == [1, 2, 3]
        with pytest.raises(DLedgerError) as ei:
            c.get(99)
        assert ei.value.code == RC.INDEX_OUT_OF_RANGE and not ei.value.indeterminate


def test_get_crc_failure_is_disk_error(make_cluster):
    cl = make_cluster()
    cl.store(b"good")
    bad = bytearray(codec.encode_entry(1, 1, 52, b"body"))
    bad[-1] ^= 0xFF
    cl.entries.append(bytes(bad))
    with client(cl) as c:
        assert c.get(0).body == b"good"
        with pytest.raises(DLedgerError) as ei:
            c.get(1)
    assert ei.value.code == RC.DISK_ERROR


def test_get_retries_after_a_silent_leader(make_cluster):
    """Reads are idempotent: a lost answer is asked again (here: after the leader moved)."""
    cl = make_cluster()
    cl.store(b"x")
    n0 = cl.nodes["n0"]

    def drop_first_get(node, msg):
        if isinstance(msg, P.GetRequest) and node.count(P.GetRequest) == 1:
            cl.leader = "n1"
            return []
        return None

    n0.script = drop_first_get
    with client(cl) as c:
        assert c.get(0).body == b"x"
    assert cl.nodes["n1"].count(P.GetRequest) == 1


# ------------------------------------------------------------------------------------ metadata


def test_metadata_with_a_dead_node(make_cluster):
    cl = make_cluster(["n0", "n1", "n2"], down=("n2",))
    cl.leader = "n1"
    cl.store(b"a")
    with client(cl) as c:
        m = c.metadata()
    assert (m.group, m.leader_id, m.term) == (GROUP, "n1", 1)
    assert [n.id for n in m.nodes] == ["n0", "n1", "n2"]
    n0, n1, n2 = m.nodes
    assert (n0.role, n0.leader, n0.alive) == ("FOLLOWER", "n1", True)
    assert (n1.role, n1.term, n1.ledger_begin_index, n1.ledger_end_index, n1.committed_index) == (
        "LEADER", 1, 0, 0, 0)
    assert n2.alive is False
    assert (n2.role, n2.term, n2.leader, n2.ledger_begin_index, n2.ledger_end_index,
            n2.committed_index) == (None,) * 6
    assert n2.address == f"127.0.0.1:{cl.ports['n2']}"


def test_metadata_highest_term_claim_wins(make_cluster):
    cl = make_cluster()
    cl.nodes["n0"].script = lambda node, msg: [P.MetadataResponse(
        RC.SUCCESS, GROUP, 3, "n0", "n0", Role.LEADER, request_id=msg.request_id)]
    cl.nodes["n1"].script = lambda node, msg: [P.MetadataResponse(
        RC.SUCCESS, GROUP, 4, "n2", "n1", Role.FOLLOWER, request_id=msg.request_id)]
    cl.nodes["n2"].script = lambda node, msg: [P.MetadataResponse(
        RC.SUCCESS, GROUP, 5, "", "n2", Role.CANDIDATE, request_id=msg.request_id)]
    with client(cl) as c:
        m = c.metadata()
    assert (m.leader_id, m.term) == ("n2", 4)
    assert [n.role for n in m.nodes] == ["LEADER", "FOLLOWER", "CANDIDATE"]


def test_cli_metadata_json_exact_keys(make_cluster, capsys):
    cl = make_cluster(["n0", "n1", "n2"], down=("n1",))
    rc = cli.main(["metadata", "--peers", cl.peers, "--json", "--timeout", "0.5"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    assert list(doc) == ["group", "leader", "term", "nodes"]
    assert (doc["group"], doc["leader"], doc["term"]) == (GROUP, "n0", 1)
    keys = ["id", "address", "role", "term", "leader", "ledger_begin_index", "ledger_end_index",
            "committed_index", "alive"]
    # The documented keys (docs/client.md "CLI"), in order, then what the table also shows (added,
    # never instead)
    added = ["lag", "version", "store_bytes", "disk_usage_ratio", "config_index", "member"]
    assert [list(n) for n in doc["nodes"]] == [keys + added] * 3
    assert [n["role"] for n in doc["nodes"]] == ["LEADER", None, "FOLLOWER"]
    dead = doc["nodes"][1]
    assert dead["alive"] is False and dead["id"] == "n1"
    assert all(dead[k] is None for k in keys if k not in ("id", "address", "alive"))


def test_cli_metadata_table(make_cluster, capsys):
    cl = make_cluster()
    assert cli.main(["metadata", "--peers", cl.peers]) == 0
    out = capsys.readouterr().out
    assert "LEADER" in out and "FOLLOWER" in out and "n2" in out


# ------------------------------------------------------------------------------------ CLI


def test_cli_append_and_get(make_cluster, capsys, monkeypatch):
    cl = make_cluster()
    assert cli.main(["append", "--peers", cl.peers, "hello", "wörld"]) == 0
    assert capsys.readouterr().out.splitlines() == ["0 1", "1 1"]
    import io
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"l1\nl\\2\n")))
    assert cli.main(["append", "--peers", cl.peers, "-"]) == 0
    assert capsys.readouterr().out.splitlines() == ["2 1", "3 1"]
    cl.store(b"", magic=codec.MAGIC_NOOP)
    cl.store(b"tab\there\xff")
    assert cli.main(["get", "--peers", cl.peers, "--index", "0", "--count", "10"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "0 1 hello", "1 1 wörld", "2 1 l1", "3 1 l\\\\2", "4 1 (noop)", "5 1 tab\\there\\xff"]
    assert cli.main(["get", "--peers", cl.peers, "--index", "4", "--count", "2", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["type"] == "NOOP" and rows[0]["body_b64"] == ""
    assert base64.b64decode(rows[1]["body_b64"]) == b"tab\there\xff"


def test_cli_append_error_is_one_line(make_cluster, capsys):
    cl = make_cluster(["n0"])
    cl.nodes["n0"].script = (lambda node, msg: [P.AppendResponse(
        RC.WAIT_QUORUM_ACK_TIMEOUT, GROUP, 1, "n0", request_id=msg.request_id)]
        if isinstance(msg, P.AppendRequest) else None)
    rc = cli.main(["append", "--peers", cl.peers, "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1
    assert "WAIT_QUORUM_ACK_TIMEOUT" in err[0] and "indeterminate: it may still be committed" in err[0]
    rc = cli.main(["get", "--peers", cl.peers, "--index", "7"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "INDEX_OUT_OF_RANGE" in err[0]


def test_transfer_leadership(make_cluster, capsys):
    cl = make_cluster()
    with client(cl) as c:
        m = c.transfer_leadership("n2")
        assert m is not None and m.leader_id == "n2" and m.term == 2
        c.transfer_leadership("n2")  # already leader: nothing to do
        with pytest.raises(DLedgerError) as ei:
            c.transfer_leadership("nX")
        assert ei.value.code == RC.UNKNOWN_MEMBER
        assert c.append(b"after").index == 0  # the client follows the new leader
    assert cl.nodes["n2"].count(P.AppendRequest) == 1
    assert cli.main(["transfer", "--peers", cl.peers, "--to", "n1"]) == 0
    assert cl.leader == "n1"
    assert "n1" in capsys.readouterr().out


def test_transfer_refused_is_definite(make_cluster, capsys):
    cl = make_cluster()
    cl.nodes["n0"].script = (lambda node, msg: [cl.error(msg, RC.TAKE_LEADERSHIP_FAILED)]
                             if isinstance(msg, P.LeadershipTransferRequest) else None)
    with client(cl) as c, pytest.raises(DLedgerError) as ei:
        c.transfer_leadership("n2")
    assert ei.value.code == RC.TAKE_LEADERSHIP_FAILED and not ei.value.indeterminate
    assert cli.main(["transfer", "--peers", cl.peers, "--to", "n2", "--timeout", "2"]) == 1
    assert "TAKE_LEADERSHIP_FAILED" in capsys.readouterr().err
    assert cl.leader == "n0"


# ------------------------------------------------------------------------------------ lifecycle


def test_close_with_requests_in_flight(make_cluster):
    cl = make_cluster()
    n0 = cl.nodes["n0"]
    n0.script = lambda node, msg: [] if isinstance(msg, P.AppendRequest) else None
    c = client(cl, timeout=30.0)
    try:
        bodies = {b"%d" % i for i in range(10)}
        futs = [c.append_async(b) for b in sorted(bodies)]
        # ours only: a port freed by an earlier test can be reused here, and a DEALER somewhere
        # still connected to it sends its retries to this node too (seen once in a full run)
        n0.wait_for(lambda n: sum(1 for m in n.received
                                  if type(m) is P.AppendRequest and bytes(m.body) in bodies) == 10)
    finally:
        c.close()
    assert io_threads() == []
    for f in futs:
        e = f.exception(0)
        assert isinstance(e, DLedgerIndeterminateError) and e.indeterminate
    with pytest.raises(RuntimeError):
        c.append(b"late")
    c.close()  # idempotent


def test_close_fails_unsent_calls_definitely(make_cluster):
    cl = make_cluster()
    cl.leader = None  # nothing can be sent: calls wait for a leader
    c = client(cl, timeout=30.0)
    try:
        f = c.append_async(b"x")
        cl.nodes["n0"].wait_for(lambda n: n.count(P.MetadataRequest) >= 1)
    finally:
        c.close()
    e = f.exception(0)
    assert isinstance(e, DLedgerError) and not e.indeterminate
    assert sum(n.count(P.AppendRequest) for n in cl.nodes.values()) == 0


@pytest.mark.parametrize("address", ["bad host:7000", "no-such-scheme://x:7000", "a\x00b:7000"])
def test_a_member_with_an_unusable_address_in_metadata_leaves_the_client_working(make_cluster, address):
    """A METADATA answer names a member whose address libzmq refuses. Before the fix the
    client's I/O thread died on it: every call failed and the client was dead for good. Now
    that member is left out and the client goes on with the others."""
    fake = make_cluster(["n0"])
    fake.store(b"e0")

    def script(node, msg):  # noqa: ANN001, ANN202
        if isinstance(msg, P.MetadataRequest):
            peers = [P.PeerInfo("n0", f"127.0.0.1:{fake.ports['n0']}", 0), P.PeerInfo("bad", address, 0)]
            return [P.MetadataResponse(RC.SUCCESS, GROUP, fake.term, "n0", "n0", Role.LEADER, 0, 0, 0,
                                       peers, msg.request_id)]
        return None

    fake.nodes["n0"].script = script
    with DLedgerClient(fake.peers, GROUP, timeout=2.0) as c:
        for _ in range(2):
            assert c.get(0).body == b"e0"
        assert c._thread.is_alive()
        assert "bad" not in c.peers
        assert c.append(b"e1").index == 1
