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
import threading

import pytest
from cluster import ROOT, read_log, wait_for

from ipc.client import DLedgerError
from ipc.entry_codec import MAGIC_NORMAL
from ipc.security import local_group_keys

pytestmark = pytest.mark.integration


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
    acked: dict[int, bytes] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        with c.client(timeout=30) as w:
            i = 0
            while not stop.is_set():
                body = b"w-%d" % i
                try:
                    acked[w.append(body).index] = body
                except DLedgerError as e:  # only an indeterminate answer may be lost here
                    if not e.indeterminate:
                        errors.append(e)
                i += 1

    t = threading.Thread(target=writer, name="writer")
    t.start()
    try:
        wait_for(lambda: len(acked) >= 20, 20, "the writer commits")
        c.nodes[dead].kill()  # the machine is gone for good
        n = len(acked)
        wait_for(lambda: len(acked) >= n + 20, 20, "two of three commit on")

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
        n = len(acked)
        wait_for(lambda: len(acked) >= n + 20, 20, "the new group commits")

        # then another member dies: the two left (one of them the new machine) carry on
        victim = lead
        if then == "new-machine-leads-kill-a-follower":  # the new machine leads, pushing itself
            with c.client(timeout=30) as cl:
                cl.transfer_leadership("n9")
            c.wait_leader(timeout=20, among=["n9"])
            n = len(acked)
            wait_for(lambda: len(acked) >= n + 20, 20, "the new machine leads and commits")
            victim = next(x for x in c.nodes if x not in (dead, "n9"))
        c.nodes[victim].kill()
        rest = [x for x in c.nodes if x not in (victim, dead)]
        c.wait_leader(timeout=20, among=rest)
        n = len(acked)
        wait_for(lambda: len(acked) >= n + 50, 30, "the two left commit")
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    for who in rest:  # each supervisor followed the configuration, no restart
        text = c.nodes[who].log_text()
        if who != "n9":
            assert "member n9 (127.0.0.1:" in text and "starting its dispatcher" in text, who
        assert f"released (was {dead})" in text, who
    c.wait_converged(timeout=20, among=rest)
    for who in rest:  # every replica left, the new machine's included, holds each append once
        c.nodes[who].stop()
        seen: dict[bytes, int] = {}
        for index, _term, magic, body in read_log(c.nodes[who].store_dir):
            if magic == MAGIC_NORMAL:
                assert body not in seen, f"{who}: {body!r} at {seen[body]} and {index}"
                seen[body] = index
        for i, body in acked.items():
            assert seen.get(body) == i, (who, body, i, seen.get(body))


def test_the_join_benchmark_adds_and_promotes_a_machine():
    """tools/bench/join.py, small: the figures docs/performance.md gives come from this code."""
    from tools.bench import join

    r = join.run(log_mib=4, entry_kib=1)
    assert r["entries"] >= 4096 and r["promoted_at"] > r["added_at"] >= r["entries"] - 1
    assert 0 < r["add_s"] < r["total_s"]
