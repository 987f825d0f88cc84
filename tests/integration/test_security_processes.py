"""Secure groups, real processes on 127.0.0.1: CurveZMQ on the data and elector ports, member
keys bound to member ids, client keys with rights (docs/operations.md "Security")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import zmq

from ipc import protocol as P
from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from ipc.security import client_curve, keygen
from ipc.sockets import elector_address
from tests.integration.cluster import Cluster, wait_for
from tests.integration.test_metrics_health import scrape, value, with_metrics

pytestmark = pytest.mark.integration

MEMBERS = ("n0", "n1", "n2")
CLIENTS = {"admin": "admin", "writer": "write", "reader": "read"}


def make_keys(d: Path) -> Path:
    for m in MEMBERS:
        keygen(d, m)
    for name in CLIENTS:
        keygen(d / "clients", name)
    (d / "clients" / "rights").write_text("".join(f"{n} {r}\n" for n, r in CLIENTS.items()))
    # a client's own directory: its secret key and the members' public keys
    for name in CLIENTS:
        cd = d / f"as-{name}"
        cd.mkdir()
        shutil.copy(d / "clients" / f"{name}.key_secret", cd)
        (cd / f"{name}.key_secret").chmod(0o600)
        for m in MEMBERS:
            shutil.copy(d / f"{m}.key", cd)
    stranger = d / "stranger"
    keygen(stranger, "stranger")
    for m in MEMBERS:
        shutil.copy(d / f"{m}.key", stranger)
    return d


def client_key(d: Path, name: str) -> Path:
    return d / f"as-{name}" / f"{name}.key_secret"


@pytest.fixture
def secure(tmp_path: Path):
    keys = make_keys(tmp_path / "keys")
    c = Cluster(tmp_path / "group", 3, keys_dir=keys)
    c.key_file = client_key(keys, "admin")
    c.metrics = with_metrics(c)
    c.start()
    try:
        c.wait_leader(timeout=30)
        yield c, keys
    finally:
        c.close()


def _raw(ctx: zmq.Context, endpoint: str, curve: tuple | None, frame: bytes, timeout_ms: int = 800
         ) -> P.Message | None:
    """One frame to `endpoint` from a socket of our own (plain, or CURVE with `curve`)."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        if curve is not None:
            curve[0].apply(s, curve[1])
        s.connect(endpoint)
        s.send(frame)
        return P.decode(s.recv()) if s.poll(timeout_ms) else None
    finally:
        s.close()


def test_rights_per_client_key(secure) -> None:
    c, keys = secure
    # every supervisor says so at start (a leader needs only two of them: the third may log later)
    wait_for(lambda: all("secure mode: CurveZMQ" in n.log_text() for n in c.nodes.values()), 30,
             "every node to log its secure mode")
    with DLedgerClient(c.peers, timeout=10, key_file=client_key(keys, "writer")) as w:
        r = w.append(b"from-writer")
        assert w.get(r.index).body == b"from-writer"
        with pytest.raises(DLedgerError) as e:
            w.transfer_leadership(next(n for n in MEMBERS if n != c.leader()))
        assert e.value.code == RC.PERMISSION_DENIED
    with DLedgerClient(c.peers, timeout=10, key_file=client_key(keys, "reader")) as rd:
        assert rd.get(r.index).body == b"from-writer"
        assert rd.metadata().leader_id in MEMBERS
        with pytest.raises(DLedgerError) as e:
            rd.append(b"from-reader")
        assert e.value.code == RC.PERMISSION_DENIED
        assert "needs 'write'" in str(e.value)
    # no key at all, and a key no node knows: the handshake fails, the call ends in an error
    for kw in ({}, {"key_file": keys / "stranger" / "stranger.key_secret"}):
        with DLedgerClient(c.peers, timeout=3, **kw) as cl, pytest.raises(DLedgerError) as e:
            cl.append(b"never")
        assert e.value.code == RC.PERMISSION_DENIED, e.value
        assert ("refused our key" if kw else "handshake failed") in str(e.value)
    # an admin key can transfer
    lead = c.leader()
    target = next(n for n in MEMBERS if n != lead)
    with c.client() as a:
        a.transfer_leadership(target)
    assert c.wait_leader() == target
    with c.client() as a:  # nothing the refused writers sent was stored
        m = a.metadata()
        bodies = [e.body for e in a.get_range(0, m.nodes[0].ledger_end_index + 1)]
    assert b"from-reader" not in bodies and b"never" not in bodies


def test_forged_raft_messages_change_nothing(secure) -> None:
    c, keys = secure
    c.wait_converged()  # the new leader's NOOP everywhere: nothing of the group's own moves
    lead = c.leader()
    before = {nid: (v.term, v.leader_id, v.ledger_end_index) for nid, v in c.views().items()}
    group = c.group
    stranger = client_curve(keys / "stranger" / "stranger.key_secret")
    writer = client_curve(client_key(keys, "writer"))
    n1_key = client_curve(keys / "n1.key_secret", keys)  # a member speaking for another
    ctx = zmq.Context()
    answers = []
    try:
        for nid, node in c.nodes.items():
            if nid == lead:
                continue
            data = f"tcp://{node.address}"
            host, port = node.address.split(":")
            elector = elector_address(host, int(port))
            vote = P.encode(P.VoteRequest(group, nid, lead, 3000, 10**9, 3000, request_id=7))
            hb = P.encode(P.HeartbeatRequest(group, nid, lead, 3000, request_id=8))
            push = P.encode(P.PushRequest(group, nid, lead, 3000, P.PushKind.COMMIT,
                                          commit_index=10**6, request_id=9))
            install = P.encode(P.InstallRequest(group, nid, lead, 3000, b"{}", 0, b"", request_id=10))
            for who in (None, (stranger, nid)):  # no key, an unknown key: refused at the handshake
                for ep, frame in ((elector, vote), (elector, hb), (data, push), (data, install)):
                    answers.append(_raw(ctx, ep, who, frame, timeout_ms=300))
            # a client key: its handshake passes on the data port, Raft frames are refused
            for frame in (push, install):
                r = _raw(ctx, data, (writer, nid), frame)
                assert r is not None and r.code == RC.PERMISSION_DENIED, r
            if nid != "n1":  # n1's key claiming to be another member
                other = next(m for m in MEMBERS if m not in ("n1", nid))
                as_other = P.encode(P.VoteRequest(group, nid, other, 3000, 10**9, 3000, request_id=11))
                r = _raw(ctx, elector, (n1_key, nid), as_other)
                assert r is not None and r.code == RC.PERMISSION_DENIED, r
    finally:
        ctx.destroy(linger=0)
    assert answers == [None] * len(answers)
    # the refused handshakes are counted, per port, on the nodes that refused them
    for nid in MEMBERS:
        if nid != lead:
            wait_for(lambda nid=nid: (value(scrape(c.metrics[nid]), "dledger_auth_refused_total") or 0) >= 2
                     and (value(scrape(c.metrics[nid]), "dledger_elector_auth_refused_total") or 0) >= 2,
                     10, f"{nid}'s refused handshakes in its metrics")
    after = {nid: (v.term, v.leader_id, v.ledger_end_index) for nid, v in c.views().items()}
    assert after == before
    assert all(t < 3000 for t, _, _ in after.values())


def test_member_with_wrong_key_cannot_join(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    impostor = tmp_path / "impostor"  # n2's files, but a key pair the group does not know
    impostor.mkdir()
    for m in ("n0", "n1"):
        shutil.copy(keys / f"{m}.key", impostor)
    keygen(impostor, "n2")
    c = Cluster(tmp_path / "group", 3)
    c.key_file = client_key(keys, "admin")
    c.nodes["n0"].flags = c.nodes["n1"].flags = ["--keys-dir", str(keys)]
    c.nodes["n2"].flags = ["--keys-dir", str(impostor)]
    try:
        c.start()
        lead = c.wait_leader(timeout=30, among=["n0", "n1"])
        two = ";".join(f"{n}-{c.nodes[n].address}" for n in ("n0", "n1"))
        with DLedgerClient(two, group=c.group, timeout=10, key_file=c.key_file) as cl:
            for i in range(5):
                cl.append(b"e%d" % i)
        # the group's key for n2 is not the one n2 holds: nobody can reach it as n2
        assert c.views()["n2"] is None
        # asked with its own key, n2 says it never got an entry nor heard of a leader
        ctx = zmq.Context()
        try:
            own = client_curve(impostor / "n2.key_secret", impostor)
            r = _raw(ctx, f"tcp://{c.nodes['n2'].address}", (own, "n2"),
                     P.encode(P.MetadataRequest(c.group, "n2", request_id=1)))
        finally:
            ctx.destroy(linger=0)
        assert isinstance(r, P.MetadataResponse), r
        assert r.ledger_end_index < 0 and r.role != Role.LEADER and r.leader_id == ""
        view = c.views()[lead]
        assert view is not None and view.ledger_end_index >= 5 and view.leader_id == lead
    finally:
        c.close()


class _RecordingProxy:
    """A TCP relay to `target` that keeps every byte the client sent (a wiretap)."""

    def __init__(self, target: tuple[str, int]) -> None:
        import socket
        import threading

        self.target = target
        self.sent = bytearray()
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import select
        import socket

        self.lsock.settimeout(10)
        try:
            down, _ = self.lsock.accept()
        except OSError:
            return
        up = socket.create_connection(self.target)
        try:
            while not self.stop.is_set():
                ready, _, _ = select.select([down, up], [], [], 0.05)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is down:
                        self.sent += data
                        up.sendall(data)
                    else:
                        down.sendall(data)
        finally:
            down.close()
            up.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.lsock.close()


def test_recorded_frames_replayed_on_a_new_connection_are_refused(secure) -> None:
    import socket

    c, keys = secure
    lead = c.leader()
    host, port = c.nodes[lead].address.split(":")
    proxy = _RecordingProxy((host, int(port)))
    ctx = zmq.Context()
    body = b"recorded-append"
    try:
        writer = client_curve(client_key(keys, "writer"))
        r = _raw(ctx, f"tcp://127.0.0.1:{proxy.port}", (writer, lead),
                 P.encode(P.AppendRequest(c.group, lead, body, request_id=5)), timeout_ms=5000)
        assert isinstance(r, P.AppendResponse) and r.code == RC.SUCCESS, r
    finally:
        ctx.destroy(linger=0)
        proxy.close()
    assert len(proxy.sent) > len(body)  # the handshake and the encrypted APPEND were recorded
    # the recording, replayed byte for byte on a new connection: the node hangs up
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(bytes(proxy.sent))
        got = b""
        while True:  # until the node closes the connection (a deadline from the timeout)
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    with c.client() as a:  # a later append lands right after the recorded one: nothing between
        after = a.append(b"after-replay")
        bodies = [e.body for e in a.get_range(r.index, after.index - r.index + 1)]
    assert bodies == [body, b"after-replay"], bodies


def test_a_node_without_keys_says_plain_mode(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "group", 1)
    try:
        c.start()
        wait_for(lambda: "plain mode: no keys_dir" in c.nodes["n0"].log_text(), 30, "the plain-mode line")
        c.wait_leader(timeout=30)  # and it serves plain clients, as every test harness does
    finally:
        c.close()
