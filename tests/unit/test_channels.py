"""node/wiring/channels.py: the declared in-node channels are what the roles open.

Every role opens its end of a node-internal channel through `open_channel` (via
`RoleContext.open`), so these tests open each declared end with the real function and check
the socket ZeroMQ made, then pass a message through it; a scan of the role modules keeps
anyone from opening a declared channel by hand again. The network-facing sockets (data port,
elector port) are opened in the role modules; an AST scan holds each module that opens one to
the role it runs in (BY_HAND) and that role to what `channels.PORTS` grants it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import zmq

from ipc import sockets
from node.wiring import channels

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ctx():
    c = zmq.Context()
    try:
        yield c
    finally:
        c.destroy(linger=0)


@pytest.mark.parametrize("ch", channels.ALL, ids=lambda c: c.name)
def test_each_declared_end_has_the_declared_socket_type(ctx, tmp_path, ch):
    bound = channels.open_channel(ctx, tmp_path, ch, ch.binder)
    assert bound.type == getattr(zmq, ch.bind_type)
    assert bound.getsockopt(zmq.LAST_ENDPOINT).decode() == channels.endpoint(tmp_path, ch)
    assert ch.connectors, f"{ch.name}: nobody connects"
    for role in ch.connectors:
        s = channels.open_channel(ctx, tmp_path, ch, f"{role}[1]" if role == "dispatcher" else role)
        assert s.type == getattr(zmq, ch.connect_type)
        s.close(linger=0)
    bound.close(linger=0)


def _send_until_received(sender: zmq.Socket, receiver: zmq.Socket, frame: bytes) -> list[bytes]:
    """PUB/SUB drops what is sent before the subscription arrived: resend, bounded by count."""
    for _ in range(200):
        sender.send(frame)
        if receiver.poll(50):
            return receiver.recv_multipart()
    raise AssertionError("nothing arrived")


@pytest.mark.parametrize("ch", channels.ALL, ids=lambda c: c.name)
def test_a_message_crosses_each_declared_channel(ctx, tmp_path, ch):
    bound = channels.open_channel(ctx, tmp_path, ch, ch.binder)
    other = channels.open_channel(ctx, tmp_path, ch, ch.connectors[0])
    try:
        # who sends: PUB -> SUB, PUSH -> PULL, DEALER -> ROUTER
        sender, receiver = (bound, other) if ch.bind_type == "PUB" else (other, bound)
        got = _send_until_received(sender, receiver, channels.ROLE_TOPIC + b"-hint")
        assert got[-1] == channels.ROLE_TOPIC + b"-hint"
    finally:
        other.close(linger=0)
        bound.close(linger=0)


@pytest.mark.parametrize("ch", channels.ALL, ids=lambda c: c.name)
def test_subscribers_conflate_exactly_where_declared(ctx, tmp_path, ch):
    """The role channel is counted (every role change matters), so its subscribers must keep
    them all; only a "latest value" hint may be conflated."""
    for role in ch.connectors:
        s = channels.open_channel(ctx, tmp_path, ch, role)
        try:
            if ch.connect_type == "SUB":
                assert s.getsockopt(zmq.CONFLATE) == (1 if ch.conflate else 0)
            else:
                assert not ch.conflate, f"{ch.name}: conflate is for SUB ends only"
        finally:
            s.close(linger=0)
    assert not channels.ROLE.conflate


@pytest.mark.parametrize("ch,role", [(channels.QUERY, "dispatcher[0]"), (channels.RESULTS, "dispatcher[1]"),
                                     (channels.ROLE, "applier")])
def test_a_role_without_an_end_is_refused_before_any_socket(ctx, tmp_path, ch, role):
    with pytest.raises(ValueError, match=f"has no end of channel '{re.escape(ch.name)}'"):
        channels.open_channel(ctx, tmp_path, ch, role)
    assert not list(tmp_path.iterdir())  # nothing bound


_BY_HAND = re.compile(r"\b(?:sub|pub|push|pull|router|dealer)\([^()]*(?:\.channel\(|endpoint\(|ipc_path\()")


def test_no_module_opens_a_declared_channel_by_hand():
    """The roles open in-node channels with RoleContext.open / open_channel only."""
    offenders = []
    for path in sorted([*(ROOT / "node").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in _BY_HAND.finditer(text)]
    assert offenders == []


# ---- network-facing sockets: held to channels.PORTS -----------------------------------------

# The modules that open a tcp socket by hand, and the role whose process runs them. A module
# not listed here may open none; a listed one only what channels.PORTS grants its role.
BY_HAND = {
    "node/roles/handler.py": "handler",  # the data port ROUTER; DEALERs for follower reads
    "node/roles/dispatcher.py": "dispatcher",  # the DEALER to its peer's data port
    "node/roles/elector_transport.py": "elector",  # the elector port ROUTER; DEALERs to peers'
    "node/roles/group_term.py": "elector",  # DEALERs to the members' data ports (lost term/vote)
}
_SOCKET_FUNCS = {"router", "dealer", "pub", "sub", "push", "pull"}


def _hand_opened(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, socket type, address helper) of each socket `path` opens without open_channel:
    a call of an ipc.sockets constructor (by name or as sockets.X) or of zmq's ctx.socket()."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    imported = {a.asname or a.name for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module == "ipc.sockets" for a in n.names}
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Name) and f.id in _SOCKET_FUNCS & imported:
            kind = f.id
        elif isinstance(f, ast.Attribute) and f.attr in _SOCKET_FUNCS and getattr(f.value, "id", "") == "sockets":
            kind = f.attr
        elif (isinstance(f, ast.Attribute) and f.attr == "socket" and n.args
              and getattr(getattr(n.args[0], "value", None), "id", "") == "zmq"):
            kind = "socket"  # ctx.socket(zmq.X): never by hand in node/
        else:
            continue
        called = [c.func for a in n.args[1:2] for c in ast.walk(a) if isinstance(c, ast.Call)]
        helpers = [name for c in called
                   if (name := getattr(c, "id", None) or getattr(c, "attr", "")).endswith("_address")]
        out.append((n.lineno, kind.upper(), helpers[0] if helpers else None))
    return out


def _violations(rel: str, opened: list[tuple[int, str, str | None]]) -> list[str]:
    role = BY_HAND.get(rel)
    ports = {p.address: p for p in channels.PORTS}
    bad = []
    for line, kind, helper in opened:
        where = f"{rel}:{line}: {kind}"
        port = ports.get(helper)
        if role is None:
            bad.append(f"{where}: this module may open no socket by hand (channels.open_channel, "
                       "or a declared port in channels.PORTS and an entry in BY_HAND)")
        elif port is None:
            bad.append(f"{where} on {helper or 'an undeclared address'}: not a declared port")
        elif not ((kind == port.bind_type and role == port.binder)
                  or (kind == port.connect_type and role in port.connectors)):
            bad.append(f"{where}: the {role} may not open a {kind} on the {port.name} "
                       f"(binder {port.binder} {port.bind_type}, connectors "
                       f"{', '.join(port.connectors)} {port.connect_type})")
    return bad


def test_network_sockets_are_opened_only_as_channels_ports_declare():
    """The handler's data ROUTER and its peer DEALERs, the dispatchers' DEALERs and the
    elector's port and DEALERs: each role opens only what channels.PORTS grants it."""
    found = {}
    for path in sorted((ROOT / "node").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != "node/wiring/channels.py" and (opened := _hand_opened(path)):
            found[rel] = opened
    assert sorted(found) == sorted(BY_HAND), "BY_HAND lists exactly the modules that open tcp sockets"
    bad = [v for rel, opened in found.items() for v in _violations(rel, opened)]
    assert bad == []
    kinds = {(BY_HAND[rel], kind, helper) for rel, opened in found.items() for _l, kind, helper in opened}
    assert kinds == {("handler", "ROUTER", "data_address"), ("handler", "DEALER", "data_address"),
                     ("dispatcher", "DEALER", "data_address"), ("elector", "DEALER", "data_address"),
                     ("elector", "ROUTER", "elector_address"), ("elector", "DEALER", "elector_address")}


@pytest.mark.parametrize("code,role,why", [
    ("from ipc.sockets import dealer, data_address\ns = dealer(ctx, data_address(h, p))\n",
     None, "may open no socket by hand"),
    ("import zmq\ns = ctx.socket(zmq.DEALER)\n", None, "may open no socket by hand"),
    ("from ipc import sockets\ns = sockets.router(ctx, sockets.data_address(h, p))\n",
     "dispatcher", "may not open a ROUTER on the data port"),
    ("from ipc.sockets import router, elector_address\ns = router(ctx, elector_address(h, p))\n",
     "handler", "may not open a ROUTER on the elector port"),
    ("from ipc.sockets import dealer\ns = dealer(ctx, 'tcp://x:1')\n", "handler", "not a declared port"),
], ids=["unlisted-module", "zmq-socket", "dispatcher-router", "handler-elector-port", "raw-address"])
def test_the_network_scan_refuses_what_the_declaration_does_not_grant(tmp_path, code, role, why):
    path = tmp_path / "m.py"
    path.write_text(code)
    rel = "node/roles/m.py"
    saved = dict(BY_HAND)
    try:
        if role is not None:
            BY_HAND[rel] = role
        got = _violations(rel, _hand_opened(path))
    finally:
        BY_HAND.clear()
        BY_HAND.update(saved)
    assert len(got) == 1 and why in got[0], got


def test_each_port_names_an_address_helper_of_ipc_sockets():
    for p in channels.PORTS:
        assert getattr(sockets, p.address)("127.0.0.1", 20000).startswith("tcp://127.0.0.1:")
        assert p.bind_type == "ROUTER" and p.connect_type == "DEALER"


# ---- query channel: a kind byte per frame ---------------------------------------------------

@pytest.mark.parametrize("kind", list(channels.QueryKind))
def test_query_frames_carry_their_kind_and_round_trip(kind):
    frame = channels.encode_query(7, 41 if kind == channels.QueryKind.READ else 0, b"body", kind)
    assert frame[0] == kind  # the kind byte comes first
    got = channels.decode_query(frame)
    assert got == channels.Query(7, 41 if kind == channels.QueryKind.READ else 0, b"body", kind)
    assert got.kind is kind


def test_query_kind_is_explicit_not_a_read_index_value():
    # a read at any index, negative ones included, stays a read: no index value means "snapshot"
    for read_index in (-3, -2, -1, 0, 2**62):
        assert channels.decode_query(channels.encode_query(1, read_index, b"")).kind \
            == channels.QueryKind.READ
    assert channels.encode_query(1, 5, b"x") == channels.encode_query(1, 5, b"x", channels.QueryKind.READ)


@pytest.mark.parametrize("frame", [b"", b"\x01" + b"\x00" * 15, b"\x00" + b"\x00" * 16,
                                   b"\x09" + b"\x00" * 16 + b"req"])
def test_query_frames_too_short_or_of_an_unknown_kind_are_refused(frame):
    assert channels.decode_query(frame) is None
