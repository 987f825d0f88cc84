"""node/wiring/doorbells.py and the declared doorbells of node/wiring/channels.py.

Each declared doorbell is opened by its real waiter and ringers through `open_bell` (what
`RoleContext.bell` calls) and polled in a `zmq.Poller` as the roles poll it; the properties the
roles rely on (docs/contracts.md C24) are checked one by one: a ring wakes the waiter, a drain
leaves nothing behind, a ring is never lost across the waiter's restart nor blocks when nobody
drains, and one crosses real processes.
"""

from __future__ import annotations

import os

import pytest
import zmq

from node.wiring import channels
from node.wiring.doorbells import Doorbell, DoorbellError


def _readable(bell: Doorbell, timeout_ms: int = 0) -> bool:
    poller = zmq.Poller()
    poller.register(bell.fd, zmq.POLLIN)
    return bool(poller.poll(timeout_ms))


def _role(kind: str) -> str:
    return f"{kind}[1]" if kind == "dispatcher" else kind


@pytest.mark.parametrize("bell", channels.BELLS, ids=lambda b: b.name)
def test_each_ringer_wakes_the_declared_waiter(tmp_path, bell):
    slot = 1 if bell.per_peer else None
    waiter = channels.open_bell(tmp_path, bell, _role(bell.waiter), slot)
    try:
        assert not _readable(waiter)
        for kind in bell.ringers:
            ringer = channels.open_bell(tmp_path, bell, _role(kind), slot)
            try:
                ringer.ring()
                ringer.ring()
                assert _readable(waiter, 1000), f"{kind} rang {bell.name}: the waiter did not wake"
                assert waiter.drain() == 2
                assert not _readable(waiter)  # drained: the next poll sleeps
            finally:
                ringer.close()
    finally:
        waiter.close()
    assert [p.name for p in tmp_path.iterdir()] == [bell.file_name(slot)]


def test_per_peer_doorbells_are_one_per_slot(tmp_path):
    one = channels.open_bell(tmp_path, channels.APPENDED_BELL, "dispatcher[1]", 1)
    two = channels.open_bell(tmp_path, channels.APPENDED_BELL, "dispatcher[2]", 2)
    ring_two = channels.open_bell(tmp_path, channels.APPENDED_BELL, "handler", 2)
    try:
        ring_two.ring()
        assert _readable(two, 1000) and not _readable(one)
    finally:
        for b in (one, two, ring_two):
            b.close()
    with pytest.raises(ValueError, match="one per peer"):
        channels.open_bell(tmp_path, channels.APPENDED_BELL, "handler")


@pytest.mark.parametrize("bell,role", [(channels.COMMIT_BELL, "dispatcher[0]"),
                                       (channels.APPLY_BELL, "ack_checker"),
                                       (channels.ACK_BELL, "applier")])
def test_a_role_without_an_end_is_refused_before_anything_exists(tmp_path, bell, role):
    with pytest.raises(ValueError, match=f"has no end of doorbell '{bell.name}'"):
        channels.open_bell(tmp_path, bell, role, 0 if bell.per_peer else None)
    assert not list(tmp_path.iterdir())


def test_a_ring_made_while_the_waiter_restarts_is_not_lost(tmp_path):
    """The supervisor restarts a role: the ring of a ringer that outlived it wakes the new one."""
    ringer = channels.open_bell(tmp_path, channels.COMMIT_BELL, "ack_checker")
    old = channels.open_bell(tmp_path, channels.COMMIT_BELL, "handler")
    try:
        old.close()  # the handler died
        ringer.ring()
        new = channels.open_bell(tmp_path, channels.COMMIT_BELL, "handler")
        try:
            assert _readable(new, 1000)
        finally:
            new.close()
    finally:
        ringer.close()


def test_rings_nobody_drains_never_block_and_drain_takes_them_all(tmp_path):
    bell = Doorbell.open(tmp_path / "x.bell")
    try:
        rings = 100_000  # more than a pipe holds (64 KiB): the rest are dropped, never blocked
        for _ in range(rings):
            bell.ring()
        got = bell.drain()
        assert 0 < got < rings
        assert not _readable(bell)
        bell.ring()
        assert _readable(bell) and bell.drain() == 1
    finally:
        bell.close()


def test_a_ring_crosses_processes(tmp_path):
    waiter = channels.open_bell(tmp_path, channels.APPLY_BELL, "applier")
    pid = os.fork()
    if pid == 0:  # the handler's process: opens the same doorbell by name and rings
        code = 1
        try:
            b = channels.open_bell(tmp_path, channels.APPLY_BELL, "handler")
            b.ring()
            b.close()
            code = 0
        finally:
            os._exit(code)
    try:
        assert _readable(waiter, 5000)
        assert waiter.drain() == 1
    finally:
        _, status = os.waitpid(pid, 0)
        waiter.close()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_path_taken_by_something_else_is_refused(tmp_path):
    (tmp_path / "commit.bell").write_text("not a pipe")
    with pytest.raises(DoorbellError, match="not a named pipe"):
        channels.open_bell(tmp_path, channels.COMMIT_BELL, "handler")


def test_the_handler_asks_for_a_confirmation_by_ringing_and_nothing_else(tmp_path):
    """CONFIRM_LEADERSHIP travels as the `confirm` doorbell (two of a linearizable get's ZeroMQ
    messages were this and its answer); other control frames still use the control socket."""
    from node.roles.handler import ZmqHandlerTransport

    class Ctl:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def send(self, frame: bytes, flags: int = 0) -> None:
            self.sent.append(frame)

    waiter = channels.open_bell(tmp_path, channels.CONFIRM_BELL, "elector")
    ringer = channels.open_bell(tmp_path, channels.CONFIRM_BELL, "handler")
    ctl = Ctl()
    try:
        t = ZmqHandlerTransport(None, [], ctl, confirm=ringer)
        assert t.control(channels.CONFIRM_LEADERSHIP)
        assert _readable(waiter, 1000) and waiter.drain() == 1
        assert ctl.sent == []
        assert t.control(b"a transfer request")
        assert ctl.sent == [b"a transfer request"] and not _readable(waiter)
    finally:
        waiter.close()
        ringer.close()
