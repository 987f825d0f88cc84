"""A client started from any one reachable node (docs/client.md; Kafka's bootstrap.servers): it
learns the group's members from that node's METADATA, appends through the leader it names,
and fails over to members it was never given."""

import subprocess
import sys
from pathlib import Path

from ipc.client import DLedgerClient

ROOT = Path(__file__).resolve().parents[2]


def test_a_client_given_one_follower_appends_learns_the_members_and_fails_over(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    follower = next(n for n in c.nodes if n != lead)
    one = f"{follower}-{c.nodes[follower].address}"
    with DLedgerClient(one, group=c.group, timeout=15.0) as cl:
        first = cl.append(b"through a follower's directions")
        assert set(cl.peers) == set(c.nodes)  # learned from METADATA
        c.nodes[lead].kill()  # a member this client was never given
        new = c.wait_leader(timeout=20, among=[n for n in c.nodes if n != lead])
        second = cl.append(b"after the failover")
        assert second.index > first.index
    assert new != lead
    r = subprocess.run([sys.executable, "-m", "tools.cli", "append", "--peers", one, "--group", c.group,
                        "from the command line"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
