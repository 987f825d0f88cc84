"""node/channels.py: the declared in-node channels are what the roles open.

Every role opens its end of a node-internal channel through `open_channel` (via
`RoleContext.open`), so these tests open each declared end with the real function and check
the socket ZeroMQ made, then pass a message through it; a scan of the role modules keeps
anyone from opening a declared channel by hand again.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import zmq

from node import channels

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
    """APPENDED is a "latest value" hint (conflated); the role channel is counted (every role
    change matters), so its subscribers must keep them all."""
    for role in ch.connectors:
        s = channels.open_channel(ctx, tmp_path, ch, role)
        try:
            if ch.connect_type == "SUB":
                assert s.getsockopt(zmq.CONFLATE) == (1 if ch.conflate else 0)
            else:
                assert not ch.conflate, f"{ch.name}: conflate is for SUB ends only"
        finally:
            s.close(linger=0)
    assert channels.APPENDED.conflate and not channels.ROLE.conflate


@pytest.mark.parametrize("ch,role", [(channels.QUERY, "dispatcher[0]"), (channels.ACK, "handler"),
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
