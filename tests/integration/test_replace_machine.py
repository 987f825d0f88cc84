"""Replace a dead machine with no outage, by the steps of docs/operations.md "Replace a dead
machine", on real processes under a writer: a member dies for good; a new machine starts with
`server --join`; `dledger member add` makes it a learner and promotes it once caught up;
`dledger member remove` drops the dead one. Then another member is killed: the group, now
{two old members, the new machine}, elects and commits on. Every acknowledged append is on
every remaining replica exactly once, at its index."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cluster import ROOT, AppendWriter, assert_acked_once_everywhere, wait_for

from ipc.client import DLedgerError
from ipc.codes import ResponseCode as RC
from ipc.security import local_group_keys

pytestmark = pytest.mark.integration
ADD, PROMOTE, REMOVE = 1, 2, 3


def dledger(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize(("then", "secure"), [("kill-the-leader", False),
                                              ("new-machine-leads-kill-a-follower", False),
                                              ("kill-the-leader", True)])
def test_replace_a_dead_machine_by_the_documented_steps_then_kill_another(make_cluster, tmp_path,
                                                                           then, secure):
    keys = None
    if secure:  # `dledger cluster`'s layout: one keys dir, an admin client key beside the members'
        keys = tmp_path / "keys"
        key_file = local_group_keys(keys, ["n0", "n1", "n2"])
        c = make_cluster(3, start=False, keys_dir=keys)
        c.key_file = key_file
        c.start()
    else:
        c = make_cluster(3)
    auth = ["--key-file", str(c.key_file)] if secure else []
    lead = c.wait_leader(timeout=15)
    dead = next(x for x in c.nodes if x != lead)
    w = AppendWriter(c.client(timeout=30), "w", 1, close_client=True)
    try:
        wait_for(lambda: len(w.acked) >= 20, 20, "the writer commits")
        c.nodes[dead].kill()  # the machine is gone for good
        n = len(w.acked)
        wait_for(lambda: len(w.acked) >= n + 20, 20, "two of three commit on")

        # 1. start the new machine: it joins, waits to be added (a secure group: its key pair
        # first, `dledger keygen`, its public key where the leader reads keys)
        if keys is not None:
            r = dledger("keygen", "--out", str(keys), "--name", "n9")
            assert r.returncode == 0, r.stderr
        new = c.add_joiner("n9")
        new.start()
        wait_for(lambda: "serving on" in new.log_text(), 20, "the new node serves")
        # 2. add it: a learner, promoted once caught up (one command)
        r = dledger("member", "add", "--peers", c.peers, "--id", "n9", "--address", new.address,
                    "--json", "--timeout", "60", *auth)
        assert r.returncode == 0, (r.stdout, r.stderr)
        # 3. remove the dead member
        r = dledger("member", "remove", "--peers", c.peers, "--id", dead, "--json", "--timeout", "60",
                    *auth)
        assert r.returncode == 0, (r.stdout, r.stderr)
        listed = json.loads(dledger("member", "list", "--peers", c.peers, "--json", *auth).stdout)
        assert sorted(listed["voters"]) == sorted([lead, next(x for x in c.nodes if x not in (lead, dead, "n9")), "n9"])
        assert listed["learners"] == []
        n = len(w.acked)
        wait_for(lambda: len(w.acked) >= n + 20, 20, "the new group commits")

        # then another member dies: the two left (one of them the new machine) carry on
        victim = lead
        if then == "new-machine-leads-kill-a-follower":  # the new machine leads, pushing itself
            # by the CLI, given the old peers string: n9 is a member by the group's METADATA
            r = dledger("transfer", "--peers", c.peers, "--to", "n9", "--timeout", "30", *auth)
            assert r.returncode == 0, (r.stdout, r.stderr)
            c.wait_leader(timeout=20, among=["n9"])
            n = len(w.acked)
            wait_for(lambda: len(w.acked) >= n + 20, 20, "the new machine leads and commits")
            victim = next(x for x in c.nodes if x not in (dead, "n9"))
        c.nodes[victim].kill()
        rest = [x for x in c.nodes if x not in (victim, dead)]
        c.wait_leader(timeout=20, among=rest)
        n = len(w.acked)
        wait_for(lambda: len(w.acked) >= n + 50, 30, "the two left commit")
    finally:
        w.stop()
    assert not [e for e in w.errors if not e.indeterminate], w.errors
    for who in rest:  # each supervisor followed the configuration, no restart
        text = c.nodes[who].log_text()
        if who != "n9":
            assert "member n9 (127.0.0.1:" in text and "starting its dispatcher" in text, who
        assert f"released (was {dead})" in text, who
    c.wait_converged(timeout=20, among=rest)
    for who in rest:  # every replica left, the new machine's included, holds each append once
        c.nodes[who].stop()
    only = type("Replicas", (), {"nodes": {x: c.nodes[x] for x in rest}})()
    assert_acked_once_everywhere(only, [w])


def test_the_join_benchmark_adds_and_promotes_a_machine():
    """tools/bench/join.py, small: the figures docs/performance.md gives come from this code."""
    from tools.bench import join

    r = join.run(log_mib=4, entry_kib=1)
    assert r["entries"] >= 4096 and r["promoted_at"] > r["added_at"] >= r["entries"] - 1
    assert 0 < r["add_s"] < r["total_s"]


def test_add_a_fourth_promote_it_remove_the_old_leader_then_kill_one_of_the_rest(make_cluster):
    """The issue's own sequence, under two writers: a 4th machine joins as a learner and is
    promoted, the old leader is removed (it leads until its removal commits, then steps down)
    and keeps running without disturbing the group (no term inflation), then one of the others
    is killed: {one old member, the new machine} commit on. Then the killed member and the
    removed one restart: the killed one rejoins with the new machine in its configuration.
    Every acknowledged append on every replica exactly once."""
    c = make_cluster(3)
    old_leader = c.wait_leader(timeout=15)
    writers = [AppendWriter(c.client(timeout=30), f"w{k}", depth, close_client=True)
               for k, depth in ((0, 1), (1, 8))]
    try:
        def acked() -> int:
            return sum(len(w.acked) for w in writers)

        wait_for(lambda: acked() >= 40, 20, "the writers commit")
        new = c.add_joiner("n9")
        new.start()
        wait_for(lambda: "serving on" in new.log_text(), 20, "the new node serves")
        with c.client(timeout=60) as cl:
            cl.change_membership(ADD, "n9", "127.0.0.1", new.port)

            def promoted() -> bool:
                try:
                    cl.change_membership(PROMOTE, "n9")
                except DLedgerError as e:
                    assert e.code in (RC.LEARNER_BEHIND, RC.MEMBERSHIP_CHANGE_IN_PROGRESS), e
                    return False
                return True

            wait_for(promoted, 30, "n9 caught up and promoted", interval=0.05)
            cl.change_membership(REMOVE, old_leader)
        rest = [x for x in c.nodes if x != old_leader]
        now_leader = c.wait_leader(timeout=20, among=rest)
        term_after = c.term_of(now_leader)
        n = acked()
        wait_for(lambda: acked() >= n + 40, 20, "the three left commit")
        victim = next(x for x in rest if x not in ("n9", now_leader)) if now_leader != "n9" \
            else next(x for x in rest if x != "n9")
        c.nodes[victim].kill()
        two = [x for x in rest if x != victim]
        c.wait_leader(timeout=20, among=two)
        n = acked()
        wait_for(lambda: acked() >= n + 60, 30, "the two left commit")
        # the removed old leader ran throughout: it never deposed anyone
        assert c.term_of(c.leader(among=two)) <= term_after + 2, "the removed node raised the terms"
        assert c.nodes[old_leader].alive
        assert "not a voter: does not stand" in c.nodes[old_leader].log_text()
        c.nodes[victim].start()  # back, with its --peers: its log names n9
        mark = max(max(w.acked.values(), default=-1) for w in writers)

        def caught_up() -> bool:
            m = c.metadata(victim)
            return m is not None and m.leader_id in two and m.ledger_end_index > mark

        wait_for(caught_up, 60, f"{victim} follows the group again and holds what it missed")
    finally:
        for w in writers:
            w.stop()
    for w in writers:
        assert not [e for e in w.errors if not e.indeterminate], w.errors
    c.wait_converged(timeout=60, among=rest)
    assert "holds slot" in c.nodes[victim].log_text()  # its restarted supervisor dispatches to n9
    for x in c.nodes:
        c.nodes[x].stop()
    # the replicas of the group as it ends (the removed old leader stopped receiving at its removal)
    only = type("Replicas", (), {"nodes": {x: c.nodes[x] for x in rest}})()
    assert_acked_once_everywhere(only, writers)
