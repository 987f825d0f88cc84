"""Install snapshot on real processes (issue 11 §4): a follower that was down while retention
deleted the entries it needs catches up by itself from the leader's snapshot, and a follower
killed in the middle of an install finishes it after its restart."""

from pathlib import Path

from cluster import wait_for

from ipc.client import KVClient

# Small data files (64 KiB), a snapshot every 200 entries and retention that deletes whatever a
# snapshot covers as soon as it may: a few thousand puts leave the leader's log beginning far
# after anything a node that was down has.
RETENTION = dict(state_machine="kv", snapshot_threshold=200, data_file_size=64 * 1024, max_body_size=16000,
                 file_reserved_hours=0, disk_space_ratio_to_clean=0.0001)


def fill(c, keys: range, size: int = 200) -> None:
    with KVClient(c.peers, group=c.group, timeout=15.0) as kv:
        for i in keys:
            kv.put(b"k%05d" % i, b"%d-" % i + b"x" * size)


def snapshot_dirs(node) -> list[Path]:
    return sorted(Path(node.store_dir, "snapshots").glob("0*-*"))


def compacted_past(c, nid: str, index: int) -> bool:
    """The node's log begins after `index` (retention deleted it)."""
    m = c.metadata(nid)
    return m is not None and m.ledger_begin_index > index + 1


def test_a_follower_behind_a_compacted_log_installs_the_leaders_snapshot_and_catches_up(make_cluster):
    c = make_cluster(3, **RETENTION)
    lead = c.wait_leader(timeout=15)
    lagger = next(n for n in c.nodes if n != lead)
    fill(c, range(100))
    c.wait_converged(timeout=20)
    behind_at = c.metadata(lagger).ledger_end_index
    c.nodes[lagger].kill()
    fill(c, range(100, 2500))
    others = [n for n in c.nodes if n != lagger]
    wait_for(lambda: all(compacted_past(c, n, behind_at) for n in others), 30,
             "retention deleted what the stopped follower has, on both live nodes")
    c.nodes[lagger].start()
    c.wait_converged(timeout=60)
    log = c.nodes[lagger].log_text()
    assert "installed the leader's snapshot" in log, log[-3000:]
    assert "log reset to begin after the installed snapshot" in log
    lead_log = c.nodes[c.wait_leader(timeout=15)].log_text()
    assert "installing snapshot" in lead_log and "re-seed" not in lead_log
    # The lagger's state is the group's: make it the only one that can lead, read through it.
    m = c.metadata(lagger)
    assert m.ledger_begin_index > behind_at + 1  # its log now begins after the snapshot
    for n in others:
        c.nodes[n].kill()
        c.nodes[n].start()
    c.wait_leader(timeout=20)
    fill(c, range(2500, 2510))
    c.wait_converged(timeout=30)
    with KVClient(c.peers, group=c.group, timeout=15.0) as kv:
        assert kv.get(b"k00050").value.startswith(b"50-")
        assert kv.get(b"k02400").value.startswith(b"2400-")
        assert len(kv.scan(b"k0", limit=5000)) == 2510


def test_a_follower_killed_in_the_middle_of_an_install_finishes_it_after_restart(make_cluster):
    """Chunks of 1 MiB, a snapshot of several MiB: the follower is killed after the first
    chunks arrived; after its restart the leader's probe finds the partial file and the
    transfer resumes (the follower's log says where) instead of starting from byte 0."""
    c = make_cluster(3, **{**RETENTION, "snapshot_threshold": 1000, "data_file_size": 1 << 20,
                           "peer_push_quota": 1 << 20})  # 1 MiB/s: a 4 MiB install takes seconds
    lead = c.wait_leader(timeout=15)
    lagger = next(n for n in c.nodes if n != lead)
    fill(c, range(10))
    c.wait_converged(timeout=20)
    behind_at = c.metadata(lagger).ledger_end_index
    c.nodes[lagger].kill()
    fill(c, range(10, 1400), size=4000)  # ~5.6 MB of state
    others = [n for n in c.nodes if n != lagger]
    wait_for(lambda: all(compacted_past(c, n, behind_at) for n in others), 60, "retention ran")
    c.nodes[lagger].start()
    install = Path(c.nodes[lagger].store_dir, "snapshots", ".install", "data")
    wait_for(lambda: install.exists() and install.stat().st_size >= 2 << 20, 60, "two chunks arrived")
    c.nodes[lagger].kill()
    had = install.stat().st_size
    c.nodes[lagger].start()
    c.wait_converged(timeout=90)
    log = c.nodes[lagger].log_text()
    assert "resuming install of snapshot" in log and "installed the leader's snapshot" in log, log[-3000:]
    assert had >= 2 << 20
    with KVClient(c.peers, group=c.group, timeout=15.0) as kv:
        assert len(kv.scan(b"k0", limit=5000)) == 1400
