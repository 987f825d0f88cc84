"""Leadership transfer and preferred leaders (docs/election.md "Leadership transfer"; DLedger #39,
#85, #247)."""

import time

import pytest
from cluster import wait_for

from ipc.client import DLedgerError
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.wiring.listeners import RoleChangeListener


def test_transfer_to_a_follower_under_appends(make_cluster):
    c = make_cluster(3)
    mon = c.start_monitor()
    lead = c.wait_leader(timeout=15)
    target = next(x for x in c.nodes if x != lead)
    with c.client() as cl:
        acked = {cl.append(b"before-%d" % i).index: b"before-%d" % i for i in range(20)}
        futs = [cl.append_async(b"during-%d" % i) for i in range(200)]
        m = cl.transfer_leadership(target)
        assert m.leader_id == target
        for i, f in enumerate(futs):
            acked[f.result(timeout=20).index] = b"during-%d" % i
        acked[cl.append(b"after").index] = b"after"
        for i, b in acked.items():
            assert cl.get(i).body == b
    assert c.wait_leader(timeout=10) == target
    mon.stop()
    assert not mon.violations()


def test_transfer_to_a_dead_node_fails_fast_and_the_group_keeps_its_leader(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    dead = next(x for x in c.nodes if x != lead)
    c.nodes[dead].kill()
    t0 = time.monotonic()
    with c.client(timeout=5) as cl:
        with pytest.raises(DLedgerError) as ei:
            cl.transfer_leadership(dead)
        assert ei.value.code == RC.TAKE_LEADERSHIP_FAILED and not ei.value.indeterminate
        assert dead in ei.value.reason, ei.value.reason  # the leader says what went wrong with whom
        assert time.monotonic() - t0 < 3
        assert cl.append(b"still serving").index > 0
    assert c.leader(among=[x for x in c.nodes if x != dead]) == lead


def test_preferred_leader_takes_over(make_cluster):
    c = make_cluster(3, preferred_leader_ids="n2")
    wait_for(lambda: c.leader() == "n2", 20, "the preferred node n2 leads")
    c.nodes["n2"].kill()
    new = c.wait_leader(timeout=15, among=["n0", "n1"])
    assert new in ("n0", "n1")
    c.nodes["n2"].start()
    wait_for(lambda: c.leader() == "n2", 20, "n2 takes leadership back once caught up")


def test_role_change_listeners_hear_a_transfer(make_cluster, tmp_path):
    """Embedding code learns role changes: the on_role_change command and RoleChangeListener."""
    out = tmp_path / "roles.txt"
    c = make_cluster(3, on_role_change=f"sh -c 'echo $DLEDGER_NODE $DLEDGER_ROLE $DLEDGER_TERM >> {out}'")
    lead = c.wait_leader(timeout=15)
    target = next(x for x in c.nodes if x != lead)
    wait_for(lambda: f"{lead} LEADER" in out.read_text(), 10, "hook saw the first leader")
    with RoleChangeListener(c.nodes[lead].store_dir) as lst, c.client() as cl:
        cl.transfer_leadership(target)
        seen = [e.role for e in lst.events(timeout_s=3)]
    assert seen and seen[-1] != Role.LEADER, seen  # the old leader heard itself step down
    wait_for(lambda: f"{target} LEADER" in out.read_text(), 10, "hook saw the new leader")
