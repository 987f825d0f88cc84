"""`dledger member` as an operator runs it against a real 3-node group: list, remove a voter
(the group keeps committing with two), add it back (a learner, promoted once caught up), and
the refusals an operator meets: a bad --address, a change without --id, a machine that is not
a member (docs/membership.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cluster import ROOT, wait_for

pytestmark = pytest.mark.integration


def dledger(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})


def member(c, *args: str) -> dict:
    r = dledger("member", *args, "--peers", c.peers, "--json", "--timeout", "30")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout)


def test_remove_a_voter_then_add_it_back_through_the_cli(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    other = next(x for x in c.nodes if x != lead)
    first = member(c, "list")
    assert first["index"] == -1 and sorted(first["voters"]) == sorted(c.nodes) and first["learners"] == []

    removed = member(c, "remove", "--id", other)
    assert removed["index"] >= 0
    now = member(c, "list")
    assert other not in now["voters"] + now["learners"] and now["index"] == removed["index"]
    r = dledger("metadata", "--peers", c.peers, "--json")
    nodes = {n["id"]: n for n in json.loads(r.stdout)["nodes"]}
    assert (nodes[lead]["member"], nodes[lead]["config_index"]) == ("voter", removed["index"])
    wait_for(lambda: json.loads(dledger("metadata", "--peers", c.peers, "--json").stdout)["nodes"][
        list(c.nodes).index(other)]["member"] == "removed", 10, f"{other} sees itself removed")
    with c.client() as client:  # two voters commit alone (the removed one is stopped)
        c.nodes[other].stop()
        assert client.append(b"with two voters").index > removed["index"]
        c.nodes[other].start()

        added = member(c, "add", "--id", other, "--address", c.nodes[other].address)  # learner, then promoted
        assert added["index"] > removed["index"]
        back = member(c, "list")
        assert other in back["voters"] and back["learners"] == []
        wait_for(lambda: member(c, "list")["members"][0]["behind"] is not None, 10, "lag shown")
        assert client.append(b"with three again").index > added["index"]

    again = member(c, "promote", "--id", other)  # already a voter: done, no change
    assert again["index"] is None


REFUSALS = [
    (("add", "--id", "n9", "--address", "nowhere"), 2, "HOST:PORT"),
    (("remove",), 2, "needs --id"),
    (("promote", "--id", "n0", "--address", "127.0.0.1:1"), 2, "go with `member add`"),
    (("add", "--id", "n9", "--address", "{n0}", "--learner"), 1, "MEMBER_EXISTS"),
    (("remove", "--id", "n9"), 1, "UNKNOWN_MEMBER"),
]


def test_refusals_are_one_line_with_their_code(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    for argv, code, says in REFUSALS:
        argv = tuple(a.format(n0=c.nodes["n0"].address) for a in argv)
        r = dledger("member", *argv, "--peers", c.peers, "--timeout", "10")
        assert r.returncode == code, (argv, r.stdout, r.stderr)
        assert says in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
