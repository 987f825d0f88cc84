"""Retention with real processes (docs/operations.md "Disk space and retention"): old committed data
files are deleted once the disk passes the clean ratio, never while a live peer still needs them,
and their space really comes back (no process of the node keeps a deleted file open or mapped).

The tests cannot fill the real disk, so they move the threshold instead: a clean ratio just
above zero means "the disk is past it" on any machine, and 0 reserved hours means every file is
old enough.
"""

from pathlib import Path

import pytest
from cluster import wait_for

from ipc.client import DLedgerError
from ipc.codes import ResponseCode
from node.store.layout import DATA_DIR

RETAIN_NOW = {"file_reserved_hours": 0, "disk_space_ratio_to_clean": 0.0001,
              "data_file_size": 1 << 20, "max_body_size": 64 << 10}


def _data_files(store_dir: Path) -> list[Path]:
    return sorted((store_dir / DATA_DIR).iterdir())


def _deleted_files_held(pids: list[int], store_dir: Path) -> list[str]:
    """Store files that are deleted but still open or mapped by one of `pids` (space not freed)."""
    held = []
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
            fds = [str(Path(f"/proc/{pid}/fd", fd).readlink()) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue  # gone meanwhile: holds nothing
        lines = [ln for ln in maps.splitlines() if str(store_dir) in ln] + fds
        held += [f"{pid}: {ln}" for ln in lines if str(store_dir) in ln and ln.endswith("(deleted)")]
    return held


def _node_pids(node) -> list[int]:  # noqa: ANN001
    return [node.proc.pid, *node.role_pids().values()]


def test_retention_keeps_what_a_lagging_peer_needs_then_frees_the_space(make_cluster):
    c = make_cluster(3, **RETAIN_NOW)
    lead = c.wait_leader(timeout=15)
    lagger, other = (x for x in c.nodes if x != lead)
    c.nodes[lagger].kill()
    with c.client(timeout=30) as cl:
        for _ in range(40):
            cl.append_batch([bytes(1000)] * 100)  # ~4.2 MB: 4-5 data files of 1 MiB
        last = cl.append(b"last").index

    # The follower that kept up owes nobody anything: its old files go.
    wait_for(lambda: (m := c.metadata(other)) and m.ledger_begin_index > 0, 15, f"{other} deletes old files")
    # The leader holds its files for the dead follower, and says so.
    wait_for(lambda: f"{lagger} still need(s) the oldest file" in c.nodes[lead].log_text(), 15,
             "the leader keeps the lagger's files")
    assert c.metadata(lead).ledger_begin_index == 0

    c.nodes[lagger].start()
    c.wait_converged(timeout=60)
    for nid in (lead, lagger):
        wait_for(lambda nid=nid: (m := c.metadata(nid)) and m.ledger_begin_index > 0, 15,
                 f"{nid} deletes old files once every peer has them")
    # The files are gone from the directory and from every process of the node.
    for nid, node in c.nodes.items():
        # everything is committed and stored everywhere: all but the file being written go (one
        # a pass); waiting for exactly that also makes the ledger begin stable for the reads below
        wait_for(lambda node=node: len(_data_files(node.store_dir)) == 1, 15,
                 f"{nid} deletes all but its newest file")
        try:
            wait_for(lambda node=node: not _deleted_files_held(_node_pids(node), node.store_dir), 10,
                     f"{nid}'s processes let go of deleted files")
        except AssertionError as e:
            raise AssertionError(f"{e}: {node.role_pids()} {_deleted_files_held(_node_pids(node), node.store_dir)}") from None

    begin = c.metadata(lead).ledger_begin_index
    with c.client() as cl:
        assert cl.get(last).body == b"last"
        assert cl.get(begin).index == begin
        with pytest.raises(DLedgerError) as e:
            cl.get(begin - 1)
        assert e.value.code == ResponseCode.INDEX_OUT_OF_RANGE
        after = cl.append(b"after").index  # the group goes on (past a new leader's NOOP,
        assert after > last and cl.get(after).body == b"after"  # if the load cost a term)
    c.wait_converged(timeout=20)


def test_a_restarted_node_opens_at_its_new_begin(make_cluster):
    c = make_cluster(3, **RETAIN_NOW)
    c.wait_leader(timeout=15)
    with c.client(timeout=30) as cl:
        for _ in range(30):
            cl.append_batch([bytes(1000)] * 100)
    c.wait_converged(timeout=30)
    wait_for(lambda: all(v and v.ledger_begin_index > 0 for v in c.views().values()), 15,
             "every node deleted old files")
    begins = {nid: v.ledger_begin_index for nid, v in c.views().items()}
    for node in c.nodes.values():
        node.stop()
    for node in c.nodes.values():
        node.start()
    c.wait_leader(timeout=15)
    after = {nid: c.metadata(nid).ledger_begin_index for nid in c.nodes}
    assert all(after[n] >= begins[n] for n in c.nodes), (begins, after)
    with c.client() as cl:
        cl.append(b"x")
    c.wait_converged(timeout=20)


def test_a_full_disk_forces_retention_past_a_lagging_peer_and_names_it(make_cluster):
    """At the full ratio the node refuses appends (DISK_FULL) and retention no longer waits for
    a lagging peer: the group's files go, and the peer that now needs a re-seed is named.
    (Reserved hours keep every file until then, so whichever live node leads after the restart
    has files to delete.)"""
    c = make_cluster(3, **{**RETAIN_NOW, "file_reserved_hours": 72})
    lead = c.wait_leader(timeout=15)
    lagger = next(x for x in c.nodes if x != lead)
    c.nodes[lagger].kill()
    with c.client(timeout=30) as cl:
        for _ in range(30):
            cl.append_batch([bytes(1000)] * 100)
    live = [x for x in c.nodes if x != lagger]
    c.wait_converged(timeout=20, among=live)
    assert all(c.metadata(x).ledger_begin_index == 0 for x in live)  # too young to delete
    for nid in live:
        c.nodes[nid].stop()
    c.flags += ["--disk-full-ratio", "0.0001"]  # every disk is "full" from now on
    for nid in live:
        c.nodes[nid].start()
    lead = c.wait_leader(timeout=15, among=live)
    wait_for(lambda: f"retention forced past what {lagger} had stored" in c.nodes[lead].log_text(), 15,
             "forced retention names the stranded peer")
    # Files go once the restarted leader's scrub has checked them (retention deletes only
    # what was checked since open: docs/store.md "Recovery"), a few seconds after the start.
    wait_for(lambda: c.metadata(lead).ledger_begin_index > 0, 60, "the leader's files to be deleted")
    with c.client() as cl, pytest.raises(DLedgerError) as e:
        cl.append(b"x")
    assert e.value.code == ResponseCode.DISK_FULL
    c.nodes[lagger].start()
    wait_for(lambda: f"{lagger} needs entry" in c.nodes[lead].log_text(), 15,
             "the leader says the returning peer needs a re-seed")
