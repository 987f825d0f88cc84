"""`SessionWriter` against a real group: caller-chosen stamps are deduplicated across clients
(a restarted process resending a batch stores nothing twice), survive a leader SIGKILL, and a
session the leader cannot vouch for fails indeterminate instead of being re-stamped."""

from __future__ import annotations

import pytest

from ipc.client import DLedgerIndeterminateError
from ipc.client.writer import SessionWriter


def _normal_bodies(cl) -> list[bytes]:  # noqa: ANN001
    m = cl.metadata()
    end = m.node(m.leader_id).committed_index
    if end < 0:  # nothing committed yet (not even the leader's NOOP)
        return []
    return [e.body for e in cl.get_range(0, end + 1) if e.type == "NORMAL"]


def test_resend_from_another_client_is_not_stored_twice(make_cluster) -> None:  # noqa: ANN001
    c = make_cluster(3)
    c.wait_leader(20)
    with c.client() as first:
        w = SessionWriter(first)
        sid = w.open_session()
        got = w.append_batch([b"a", b"b", b"c"], sid, 1)
    with c.client(sessions=False) as second:  # "the restarted driver"
        again = SessionWriter(second).append_batch([b"a", b"b", b"c"], sid, 1)
        assert [r.index for r in again] == [r.index for r in got]
        more = SessionWriter(second).append_batch([b"d"], sid, 4)
        assert more[0].index > got[-1].index  # next, or past a new leader's NOOP
        assert _normal_bodies(second) == [b"a", b"b", b"c", b"d"]


def test_fixed_stamp_survives_a_leader_kill(make_cluster) -> None:  # noqa: ANN001
    c = make_cluster(3)
    leader = c.wait_leader(20)
    with c.client(timeout=20.0) as cl:
        w = SessionWriter(cl)
        sid = w.open_session()
        w.append_batch([b"x%d" % i for i in range(50)], sid, 1)
        # Every member holds the log first: a member of a new group that is still catching up
        # does not vote (docs/election.md "Non-voting members"), and two survivors with one
        # vote between them would elect no one until the leader is back.
        c.wait_converged(timeout=30)
        c.nodes[leader].kill()
        w.append_batch([b"x%d" % i for i in range(50, 100)], sid, 51)
        w.append_batch([b"x%d" % i for i in range(50, 100)], sid, 51)  # a resend after failover
        assert _normal_bodies(cl) == [b"x%d" % i for i in range(100)]


def test_unknown_session_fails_indeterminate_and_writes_nothing(make_cluster) -> None:  # noqa: ANN001
    c = make_cluster(3)
    c.wait_leader(20)
    with c.client() as cl:
        with pytest.raises(DLedgerIndeterminateError) as ei:
            SessionWriter(cl).append_batch([b"never"], 0x7FFF0001, 1, timeout=3.0)
        assert ei.value.name == "SESSION_EXPIRED"
        assert _normal_bodies(cl) == []
