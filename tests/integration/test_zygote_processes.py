"""Roles forked from the node's zygote (node/roles/zygote.py) are what roles started as fresh
interpreters were: each its own process, a child of the supervisor, with its usual command line,
restarted when killed; a zygote that dies only means fresh interpreters from then on; and
DLEDGER_NO_ZYGOTE=1 turns it off. Real processes, real signals."""

import os
import signal
from pathlib import Path

from cluster import wait_for


def _roles(c, nid: str) -> set[str]:  # noqa: ANN001
    """The roles of node `nid` of cluster `c` (a dispatcher per other member)."""
    return {"handler", "elector", "ack_checker", *(f"dispatcher-{x}" for x in c.nodes if x != nid)}


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _args(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def _all_running(node, roles: set[str]):  # noqa: ANN001, ANN202
    """{role: pid} once every role in `roles` runs, else None (for wait_for)."""
    pids = node.role_pids()
    return pids if roles <= set(pids) else None


def _started_lines(node, role: str) -> list[str]:  # noqa: ANN001
    return [ln for ln in node.log_text().splitlines() if f" started {role} pid=" in ln]


def test_forked_roles_are_the_supervisors_children_with_their_usual_command_lines(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    n0 = c.nodes["n0"]
    pids = wait_for(lambda: _all_running(n0, _roles(c, "n0") | {"zygote"}), 15, "every role of n0 running")
    zygote = pids.pop("zygote")
    assert _children(zygote) == []  # the forks were handed to the supervisor
    assert set(_children(n0.proc.pid)) >= set(pids.values())
    for role, pid in pids.items():
        module = "node.roles." + role.split("-")[0]
        args = _args(pid)
        assert args[1:3] == ["-m", module] and args[3] == "--config", args
        assert args[4].endswith("/config.json") and Path(args[4]).is_file()
        if "-" in role:  # a dispatcher: its follower, that follower's slot and address
            peer = role.split("-")[1]
            assert args[5:7] == ["--peer", peer] and args[7] == "--slot", args
            assert args[8] == str(list(c.nodes).index(peer)) and args[9:] == ["--address", c.nodes[peer].address], args
        else:
            assert args[5:] == [], args
        assert all(ln.endswith("(forked)") for ln in _started_lines(n0, role)), role


def test_a_killed_forked_role_comes_back_and_a_dead_zygote_means_fresh_interpreters(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    node = c.nodes[next(x for x in c.nodes if x != lead)]
    pids = wait_for(lambda: _all_running(node, _roles(c, node.id) | {"zygote"}), 15, "every role running")
    os.kill(pids["ack_checker"], signal.SIGKILL)
    lines = wait_for(lambda: (x := _started_lines(node, "ack_checker"))[1:] and x, 10,
                     "the ack checker restarted")
    assert all(ln.endswith("(forked)") for ln in lines)
    assert node.role_pids().get("ack_checker") not in (None, pids["ack_checker"])

    os.kill(pids["zygote"], signal.SIGKILL)
    wait_for(lambda: f"zygote pid={pids['zygote']} exited" in node.log_text(), 10,
             "the supervisor noticed the zygote's exit")
    os.kill(pids["elector"], signal.SIGKILL)
    lines = wait_for(lambda: (x := _started_lines(node, "elector"))[1:] and x, 10,
                     "the elector restarted")
    assert lines[0].endswith("(forked)") and not lines[1].endswith("(forked)")  # a fresh interpreter
    assert "zygote" not in node.role_pids()
    assert c.wait_leader(timeout=15)
    with c.client() as cl:
        assert cl.append(b"after").index >= 0
    sup = node.proc.pid
    assert node.stop() == 0
    for pid in pids.values():  # nothing of the node is left (the zygote was already gone)
        assert not Path(f"/proc/{pid}").exists() or pid == sup


def test_no_zygote_when_turned_off(make_cluster):
    c = make_cluster(1, start=False)
    c.env["DLEDGER_NO_ZYGOTE"] = "1"
    c.start()
    c.wait_leader(timeout=15)
    n0 = c.nodes["n0"]
    pids = wait_for(lambda: _all_running(n0, {"handler", "elector", "ack_checker"}), 15,
                    "the roles running")
    assert "zygote" not in pids
    assert not any(ln.endswith("(forked)") for ln in n0.log_text().splitlines())


def test_a_process_a_dead_role_left_behind_is_reaped_not_left_a_zombie(make_cluster):
    """As the child subreaper, the supervisor inherits what a dying role leaves running (here the
    elector's on_role_change command): once that exits it must be reaped, or it stays a zombie
    for the node's whole life."""
    c = make_cluster(1, on_role_change="sleep 1")
    c.wait_leader(timeout=15)
    node = c.nodes["n0"]
    elector = wait_for(lambda: node.role_pids().get("elector"), 15, "the elector running")
    hook = wait_for(lambda: next((p for p in _children(elector) if _args(p)[:1] == ["sleep"]), None),
                    15, "the role-change command running")
    os.kill(elector, signal.SIGKILL)
    wait_for(lambda: hook in _children(node.proc.pid) or not Path(f"/proc/{hook}").exists(), 10,
             "the command handed to the supervisor")
    wait_for(lambda: not Path(f"/proc/{hook}").exists(), 15, "the orphaned command reaped")
