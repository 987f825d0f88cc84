"""Leadership is a lease (docs/contracts.md C3, C4), on a real 3-node group: a leader whose elector is
paused stops acting as leader within the lease, long before the supervisor's watchdog notices,
and a linearizable GET is answered by a leader that confirmed itself after the read arrived."""

import os
import signal
import time

from cluster import wait_for

from ipc import protocol as P
from ipc.client import DLedgerClient
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.config import NodeConfig
from node.core.lease import lease_ms


def _code(m: P.Message | None) -> int | None:
    return None if m is None else m.code


def test_a_leader_whose_elector_is_paused_stops_serving_within_the_lease(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    with c.client(timeout=5.0) as cl:
        first = cl.append(b"before")
    wait_for(lambda: _code(c.request(lead, P.GetRequest(c.group, lead, first.index, 1, False, 1))) == RC.SUCCESS,
             5, "the leader serves the committed entry")
    elector = c.nodes[lead].role_pids()["elector"]
    os.kill(elector, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        lease_s = lease_ms(NodeConfig().election_config()) / 1000

        def refuses() -> bool:
            g = c.request(lead, P.GetRequest(c.group, lead, first.index, 1, False, 2))
            a = c.request(lead, P.AppendRequest(c.group, lead, b"late", request_id=3))
            return _code(g) == RC.NOT_LEADER and _code(a) == RC.NOT_LEADER

        wait_for(refuses, 10, "the paused elector's handler refuses GET and APPEND")
        took = time.monotonic() - t0
        assert took < lease_s + 1.5, f"served as leader {took:.2f} s after its elector stopped"
        md = c.metadata(lead)
        assert md is not None and md.role != Role.LEADER, "METADATA still claims leadership"
        others = [n for n in c.nodes if n != lead]
        new = c.wait_leader(timeout=15, among=others)
        peers = ";".join(p for p in c.peers.split(";") if not p.startswith(lead + "-"))
        with DLedgerClient(peers, group=c.group, timeout=5.0) as cl:
            after = cl.append(b"after")
        assert new != lead
        g = c.request(lead, P.GetRequest(c.group, lead, after.index, 1, False, 4))
        assert _code(g) == RC.NOT_LEADER  # never INDEX_OUT_OF_RANGE for what the group committed
    finally:
        os.kill(elector, signal.SIGCONT)


def test_linearizable_get_is_served_after_the_leader_confirms_itself(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    with c.client(timeout=5.0) as cl:
        r = cl.append(b"hello")
        t0 = time.monotonic()
        e = cl.get(r.index, linearizable=True)
        took = time.monotonic() - t0
    assert bytes(e.body) == b"hello"
    assert took < 2.0, f"a linearizable GET took {took:.2f} s"
