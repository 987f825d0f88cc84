"""node.wiring.ports: free port pairs that no outgoing connection can take before the node binds."""

import socket

import pytest

from node.wiring import ports


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_pairs_are_free_apart_and_outside_the_ephemeral_range():
    low, high = ports.ephemeral_range()
    got = ports.free_port_pairs(8)
    assert len(got) == 8
    for p in got:
        assert ports.LOWEST <= p and p + 1 <= 65535
        assert p + 1 < low or p > high, f"{p}/{p + 1} inside ephemeral range {low}-{high}"
        assert _bindable(p) and _bindable(p + 1)
    assert all(abs(a - b) > 1 for i, a in enumerate(got) for b in got[i + 1:])


def test_connect_source_ports_come_from_the_ephemeral_range():
    """The premise of the module: a connection's local port is ephemeral, so a pair picked
    outside that range cannot be taken by one (the bug: kernel-picked p, with p + 1 taken)."""
    low, high = ports.ephemeral_range()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        conns = [socket.create_connection(listener.getsockname()) for _ in range(32)]
        try:
            assert all(low <= c.getsockname()[1] <= high for c in conns)
        finally:
            for c in conns:
                c.close()


def test_a_port_in_use_is_never_returned():
    """Fill part of the pool, shrink the pool to it, and the busy ports are skipped."""
    busy = []
    for p in range(40_000, 40_010):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            busy.append(s)
        except OSError:
            s.close()
    try:
        taken = {s.getsockname()[1] for s in busy}
        # ephemeral range 10000..39999 leaves 40000..65534 as the pool; bind-checked picks
        got = ports.free_port_pairs(20, ephemeral=(10_000, 39_999))
        assert all(p >= 40_000 for p in got)
        assert not taken & ({*got} | {p + 1 for p in got})
    finally:
        for s in busy:
            s.close()


@pytest.mark.parametrize("text", ["", "junk", "60000 1000", "0 0"])
def test_unreadable_range_means_linux_default(tmp_path, text):
    f = tmp_path / "range"
    f.write_text(text)
    assert ports.ephemeral_range(f) == ports.DEFAULT_EPHEMERAL
    assert ports.ephemeral_range(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL


def test_candidate_ranges_keep_both_ports_outside():
    below, above = ports.candidate_bases((32768, 60999))
    assert below[0] == ports.LOWEST and below[-1] + 1 == 32767
    assert above[0] == 61000 and above[-1] + 1 == 65535
    assert ports.candidate_bases((1024, 65535)) == []


def test_whole_range_ephemeral_falls_back_to_kernel_choice():
    got = ports.free_port_pairs(3, ephemeral=(1024, 65535))
    assert len(got) == 3 and all(_bindable(p) and _bindable(p + 1) for p in got)
