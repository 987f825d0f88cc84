"""node/wiring/fault_hooks.py: the test-only fault switches the transports consult, inert by default,
and outside the wire codec."""

from __future__ import annotations

from ipc import protocol
from node.wiring import fault_hooks


def test_fault_hook_drops_every_nth_push_only_when_enabled():
    assert not fault_hooks.FaultHook.from_env({}).enabled
    off = fault_hooks.FaultHook.from_env({})
    assert [off.drop_push() for _ in range(6)] == [False] * 6
    hook = fault_hooks.FaultHook.from_env({"DLEDGER_TEST_DROP_PUSH_EVERY": "3"})
    assert hook.enabled
    assert [hook.drop_push() for _ in range(6)] == [False, False, True, False, False, True]
    assert not fault_hooks.FaultHook.from_env({"DLEDGER_TEST_DROP_PUSH_EVERY": "x"}).enabled


def test_fault_hook_partition_file(tmp_path):
    path = tmp_path / "cut"
    hook = fault_hooks.FaultHook(partition_file=str(path))
    assert not hook.blocked("n1")  # missing file: healed
    path.write_text("n1 n2\n")
    hook._checked = -1.0  # skip the 50 ms re-check throttle
    assert hook.blocked("n1") and hook.blocked("n2") and not hook.blocked("n0")


def test_the_wire_codec_holds_no_fault_hook():
    assert not hasattr(protocol, "faults") and not hasattr(protocol, "FaultHook")


def test_the_process_wide_hook_is_inert_without_the_variables(monkeypatch):
    monkeypatch.delenv("DLEDGER_TEST_DROP_PUSH_EVERY", raising=False)
    monkeypatch.delenv("DLEDGER_TEST_PARTITION_FILE", raising=False)
    hook = fault_hooks.FaultHook.from_env()
    assert not hook.enabled and not hook.drop_push() and not hook.blocked("n1")


class _Sock:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes, flags: int = 0) -> None:
        self.sent.append(frame)


def test_the_dispatcher_transport_consults_the_hook(monkeypatch):
    from node.roles.dispatcher_transport import ZmqDispatcherTransport
    monkeypatch.setattr(fault_hooks, "faults", fault_hooks.FaultHook(drop_push_every=2))
    sock = _Sock()
    t = ZmqDispatcherTransport(sock, _Sock(), "n1")
    assert all(t.send(b"%d" % i) for i in range(1, 5))  # a dropped push still "went out"
    assert sock.sent == [b"1", b"3"]


def test_the_elector_transport_consults_the_partition_file(monkeypatch, tmp_path):
    from node.roles.elector_transport import ZmqElectorTransport
    cut = tmp_path / "cut"
    cut.write_text("n1\n")
    monkeypatch.setattr(fault_hooks, "faults", fault_hooks.FaultHook(partition_file=str(cut)))
    t = object.__new__(ZmqElectorTransport)  # no sockets: only its send path is under test
    t.dealers = {"n1": _Sock(), "n2": _Sock()}
    assert t.send("n1", b"vote") and t.send("n2", b"vote")
    assert t.dealers["n1"].sent == [] and t.dealers["n2"].sent == [b"vote"]
