"""Repair from peers on real processes (docs/store.md "Repair from peers"): a node whose
store lost committed entries (a flipped byte, a deleted or truncated segment file) starts,
does not vote or stand while the range is missing, gets it back from the leader, votes again,
and ends with the same committed entries as its peers, while the group keeps appending."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest
from cluster import read_log, transfer_to, wait_for

from ipc.client import DLedgerClient
from node.block.shared_state import SharedState
from node.store import codec
from node.store.layout import read_checkpoint

# Damage below the checkpoint's committed entry is found by the handler's scrub, not at open
# (docs/store.md "Recovery"): here it starts at once instead of 5 s after open.
OPTS = dict(data_file_size=16384, index_file_size=32 * 4096, max_body_size=8000,
            env={"DLEDGER_SCRUB_DELAY_MS": "0"})
BODY = 400  # ~37 entries per 16 KiB data file


def body(i: int) -> bytes:
    return (b"%06d:" % i * (BODY // 7 + 1))[:BODY]


def append(c, first: int, n: int) -> None:
    with DLedgerClient(c.peers, group=c.group, timeout=15.0) as cl:
        for k in range(first, first + n, 20):
            cl.append_batch([body(i) for i in range(k, min(first + n, k + 20))])


class Writer(threading.Thread):
    """Appends batches until stopped; every batch must succeed (the group keeps accepting)."""

    def __init__(self, c, first: int) -> None:
        super().__init__(daemon=True)
        self.c, self.next, self.errors = c, first, []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with DLedgerClient(self.c.peers, group=self.c.group, timeout=15.0) as cl:
                while not self.stop.is_set():
                    cl.append_batch([body(i) for i in range(self.next, self.next + 10)])
                    self.next += 10
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))

    def done(self) -> int:
        self.stop.set()
        self.join(timeout=30)
        assert not self.is_alive() and not self.errors, self.errors
        return self.next


def block_of(node) -> SharedState:
    return SharedState.attach(node.shm_name())


def block_value(node, field: str) -> int:
    st = block_of(node)
    try:
        return st.get(field)
    finally:
        st.close()


def data_files(node) -> list[Path]:
    return sorted(Path(node.store_dir, "data").iterdir())


def entries_in(path: Path) -> list[tuple[int, int, int]]:
    """(offset, index, size) of each entry in one data file (entries never span files)."""
    raw, off, out = path.read_bytes(), 0, []
    while off + codec.HEADER_SIZE <= len(raw):
        magic, size, idx = codec.HEADER.unpack_from(raw, off)[:3]
        if magic not in codec.ENTRY_MAGICS:
            break
        out.append((off, idx, size))
        off += size
    return out


def flip_body_byte(node) -> int:
    """Flip one byte in the body of the middle entry of the second-to-last data file (inside
    the CRC-checked tail at open). Returns the damaged index."""
    f = data_files(node)[-2]
    off, idx, size = entries_in(f)[len(entries_in(f)) // 2]
    with open(f, "r+b") as fh:
        fh.seek(off + codec.HEADER_SIZE + size // 3)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0x20]))
    return idx


def flip_checkpointed_entry(node) -> int:
    """Flip one byte of the body CRC of the checkpoint's committed entry C of a stopped node
    (the CRC, not the body: C may be a NOOP, whose body is empty): the walk at
    open starts at C and CRC-checks it, so the damage is found before the elector starts
    (docs/store.md "Recovery"). An entry below C would be left to the scrub, and the node may
    vote, even win, before the scrub reaches it (safe: its log end, all a vote compares, was
    walked)."""
    idx = read_checkpoint(node.store_dir).committed_index
    assert idx >= 0
    for f in data_files(node):
        for off, i, _size in entries_in(f):
            if i == idx:
                with open(f, "r+b") as fh:
                    fh.seek(off + codec.BODY_CRC_OFFSET)
                    b = fh.read(1)
                    fh.seek(-1, os.SEEK_CUR)
                    fh.write(bytes([b[0] ^ 0x20]))
                return idx
    raise AssertionError(f"entry {idx} not found in {node.store_dir}")


def delete_middle_segment(node) -> int:
    files = data_files(node)
    f = files[len(files) // 2]
    idx = entries_in(f)[0][1]
    f.unlink()
    return idx


def delete_first_segment(node) -> int:
    """The first data file gone: not what retention does (it records the new begin first),
    so the whole log is fetched again (the store keeps no holes)."""
    data_files(node)[0].unlink()
    return 0


def truncate_data_file(node) -> int:
    f = data_files(node)[-3]
    idx = entries_in(f)[0][1]
    os.truncate(f, 5000)
    return idx


def truncate_index_file(node) -> int:
    f = sorted(Path(node.store_dir, "index").iterdir())[0]
    os.truncate(f, 32 * 100)
    return -1  # derived data: rebuilt from the data list, nothing to fetch


def zero_index_records(node) -> int:
    """Three committed entries' index records zeroed (below the checkpoint's committed entry:
    the scrub meets them). The index is derived data: rewritten from the intact entries,
    nothing fetched, the node keeps its vote (docs/store.md "Recovery")."""
    f = sorted(Path(node.store_dir, "index").iterdir())[0]
    with open(f, "r+b") as fh:
        fh.seek(100 * 32)
        fh.write(b"\0" * 96)
    return -1


def garble_checkpoint(node) -> int:
    """Bytes that are no checkpoint: set aside (kept as `checkpoint.damaged`), the store
    recovers from its files alone; nothing to fetch (docs/store.md "Recovery")."""
    Path(node.store_dir, "checkpoint").write_bytes(b"\xff\xfe not a checkpoint")
    return -1


# What a damage that loses no entry says in the restarted node's log.
NOTHING_LOST = {"truncate_index_file": "rebuilding it from the data",
                "zero_index_records": "rewrote 3 damaged index record(s) from entry 100",
                "garble_checkpoint": "the checkpoint is unreadable"}


def converged_then_stopped(c) -> int:
    """Wait until every node holds the same committed log, note its end, stop every node at
    once (one by one, the later ones could elect a leader whose NOOP the first lacks)."""
    c.wait_converged(timeout=60)
    end = c.metadata(next(iter(c.nodes))).committed_index
    for n in c.nodes.values():
        n.proc.send_signal(15)
    for n in c.nodes.values():
        n.stop()
    return end


def same_logs(c, end: int) -> dict[str, list]:
    """Every node's entries up to `end` (index, term, magic, body), compared byte for byte."""
    logs = {nid: read_log(n.store_dir)[:end + 1] for nid, n in c.nodes.items()}
    first = next(iter(logs.values()))
    assert len(first) == end + 1
    for nid, log in logs.items():
        assert log == first, f"{nid}'s log differs from the others' ({len(log)} vs {len(first)} entries)"
    return logs


def test_follower_with_damaged_committed_entry_does_not_vote_until_repaired(make_cluster):
    """The leader is down and only the damaged node and one healthy follower are up: two of
    three would elect a leader, but the damaged node neither votes nor stands, so none is
    elected (however many votes the healthy one asks for). Once the old leader is back, a
    leader is elected without the damaged node, which then gets the range back."""
    c = make_cluster(3, **OPTS)
    lead = c.wait_leader(timeout=60)
    append(c, 0, 600)
    c.wait_converged(timeout=30)
    victim, other = [n for n in c.nodes if n != lead]
    c.nodes[victim].stop()
    bad = flip_checkpointed_entry(c.nodes[victim])
    c.nodes[lead].stop()
    seen = len(c.nodes[victim].log_text())  # a new member's first life may say "does not vote" too

    def since_restart() -> str:
        return c.nodes[victim].log_text()[seen:]

    c.nodes[victim].start()
    wait_for(lambda: "does not vote or stand: its store is fetching" in since_restart(), 30,
             "the damaged node to say it does not vote")
    assert f"DAMAGED committed entries from index {bad}" in since_restart()  # at open, before
    assert block_value(c.nodes[victim], "repair_index") >= 599
    assert block_value(c.nodes[victim], "not_voting") == 1
    asked = block_value(c.nodes[other], "votes_requested")
    wait_for(lambda: block_value(c.nodes[other], "votes_requested") >= asked + 10, 60,
             "the healthy follower to ask for votes ten more times")
    assert c.leader() is None, c.describe()
    assert block_value(c.nodes[victim], "votes_granted") == 0
    c.nodes[lead].start()
    c.wait_leader(timeout=60)
    append(c, 600, 100)
    wait_for(lambda: block_value(c.nodes[victim], "repair_index") == -1, 30, "the repair to finish")
    wait_for(lambda: block_value(c.nodes[victim], "not_voting") == 0, 30, "the node to vote again")
    assert "votes again" in since_restart()
    logs = same_logs(c, converged_then_stopped(c))
    assert [e[3] for e in logs[victim] if e[2] == codec.MAGIC_NORMAL][:700] == [body(i) for i in range(700)]


@pytest.mark.parametrize("damage", [flip_body_byte, delete_middle_segment, delete_first_segment, truncate_data_file,
                                    truncate_index_file, zero_index_records, garble_checkpoint],
                         ids=lambda f: f.__name__)
def test_damaged_follower_repairs_while_the_group_keeps_appending(make_cluster, damage):
    c = make_cluster(3, **OPTS)
    lead = c.wait_leader(timeout=60)
    append(c, 0, 600)
    c.wait_converged(timeout=30)
    victim = next(n for n in c.nodes if n != lead)
    c.nodes[victim].stop()
    bad = damage(c.nodes[victim])
    w = Writer(c, 600)
    w.start()
    seen = len(c.nodes[victim].log_text())

    def since_restart() -> str:
        return c.nodes[victim].log_text()[seen:]

    try:
        c.nodes[victim].start()
        wait_for(lambda: "recovered begin" in since_restart(), 30, "the node to open its store")
        vlog = since_restart()
        if bad >= 0:
            wait_for(lambda: f"DAMAGED committed entries from index {bad}" in since_restart(), 30,
                     "the damage to be found (at open or by the scrub)")
            wait_for(lambda: refrained_from_voting(since_restart()), 30,
                     "the damaged node to stop voting (or to be repaired before its elector was ready)")
        else:
            wait_for(lambda: NOTHING_LOST[damage.__name__] in since_restart(), 30,
                     "the store to say what it rebuilt (at open, or the scrub)")
            assert "DAMAGED" not in since_restart(), vlog[-3000:]
        wait_for(lambda: block_value(c.nodes[victim], "repair_index") == -1, 60, "the repair to finish")
        wait_for(lambda: w.next >= 800, 60, "appends to go on during the repair")
    finally:
        total = w.done()
    wait_for(lambda: block_value(c.nodes[victim], "not_voting") == 0, 30, "the node to vote again")
    logs = same_logs(c, converged_then_stopped(c))
    bodies = [e[3] for e in logs[victim] if e[2] == codec.MAGIC_NORMAL]
    assert bodies == [body(i) for i in range(total)]


def refrained_from_voting(log: str) -> bool:
    """The restarted node's log shows that it did not vote while it knew it was damaged: its
    elector said it does not vote, or the repair was done before the elector was ready to vote
    at all (on a loaded machine the elector's start can take longer than fetching a few entries
    again, and then it never sees the damage)."""
    if "does not vote or stand" in log:
        return True
    repaired, ready = log.find("store repaired"), log.find("elector ready")
    if repaired >= 0 and (ready < 0 or repaired < ready):
        return True
    # Found by a check after the elector was ready (the scrub, or a push that read the entry),
    # and repaired within one heartbeat (the elector reads the repair mark at each decision,
    # and logs it when it sees it): no election on this node from the moment the damage was
    # found until the repair (no vote round, no new term) means no vote could be given. What
    # the elector did before the damage was found, it did not know of.
    found = [i for i in (log.find(" is damaged"), log.find("DAMAGED committed entries")) if i >= 0]
    if not found or not 0 <= ready < repaired:
        return False
    term = re.search(r"elector ready term=(\d+)", log[ready:])
    window = log[max(ready, min(found)):repaired]
    terms = set(re.findall(r" became \w+ term=(\d+)", window))
    return term is not None and "vote round" not in window and terms <= {term.group(1)}


def _restart_with(c, victim: str, damage) -> str:
    """Stop `victim`, damage its store, start it; return its log since the restart once the
    elector decided what it may vote in."""
    node = c.nodes[victim]
    node.stop()
    damage(Path(node.store_dir))
    seen = len(node.log_text())
    node.start()
    wait_for(lambda: "votes from term" in node.log_text()[seen:] or "a new group" in node.log_text()[seen:],
             60, f"{victim} to learn the group's term")
    return node.log_text()[seen:]


def _term_file(node) -> dict[str, str]:
    text = Path(node.store_dir, "currterm").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.mark.parametrize("how", ["deleted", "garbled"])
def test_lost_term_vote_file_rejoins_without_a_vote_in_any_term_it_may_have_voted_in(make_cluster, how):
    c = make_cluster(3, **OPTS)
    lead = c.wait_leader(timeout=60)
    append(c, 0, 100)
    c.wait_converged(timeout=30)
    victim = next(n for n in c.nodes if n != lead)
    before = int(_term_file(c.nodes[victim])["currTerm"])

    def damage(store: Path) -> None:
        if how == "deleted":
            (store / "currterm").unlink()
        else:
            (store / "currterm").write_bytes(b"currTerm=\xff\x00\n")

    w = Writer(c, 100)
    w.start()
    try:
        text = _restart_with(c, victim, damage)
        assert "not voting until 2 other member(s) told their term" in text, text[-3000:]
        assert "a new group" not in text
        tv = _term_file(c.nodes[victim])
        assert int(tv["currTerm"]) >= before and tv["voteLeader"] == "<lost>"
        assert "catchUpIndex" not in tv  # its log is intact: only the term was lost
        wait_for(lambda: w.next >= 300, 60, "appends to go on")
    finally:
        total = w.done()
    wait_for(lambda: block_value(c.nodes[victim], "not_voting") == 0, 30, "the node to vote")
    # It can lead again (it votes for itself in a later term): hand it the leadership.
    c.wait_converged(timeout=60)
    with DLedgerClient(c.peers, group=c.group, timeout=15.0) as cl:
        transfer_to(cl, victim, timeout=20)
    assert c.wait_leader(timeout=60) == victim
    append(c, total, 20)
    logs = same_logs(c, converged_then_stopped(c))
    assert [e[3] for e in logs[victim] if e[2] == codec.MAGIC_NORMAL] == [body(i) for i in range(total + 20)]


def test_wiped_store_catches_up_before_it_votes(make_cluster):
    """A member restarted with an empty store directory: the group has a term and a log, so
    it lost its disk; it follows, catches up to what the group had, and only then votes. A
    brand-new group (every other test here) starts from empty stores and elects at once."""
    import shutil

    c = make_cluster(3, **OPTS)
    lead = c.wait_leader(timeout=60)
    append(c, 0, 600)
    c.wait_converged(timeout=30)
    victim = next(n for n in c.nodes if n != lead)
    end = c.metadata(lead).ledger_end_index
    w = Writer(c, 600)
    w.start()
    try:
        text = _restart_with(c, victim, lambda store: shutil.rmtree(store))
        assert "an empty store (a new member, or a lost disk)" in text, text[-3000:]
        assert "once entries up to" in text
        catch_up = int(_term_file(c.nodes[victim])["catchUpIndex"])
        assert catch_up >= end
        wait_for(lambda: f"caught up to index {catch_up}" in c.nodes[victim].log_text(), 60,
                 "the wiped node to catch up")
        wait_for(lambda: w.next >= 800, 60, "appends to go on")
    finally:
        total = w.done()
    wait_for(lambda: block_value(c.nodes[victim], "not_voting") == 0, 30, "the node to vote")
    assert "catchUpIndex" not in _term_file(c.nodes[victim])
    logs = same_logs(c, converged_then_stopped(c))
    assert [e[3] for e in logs[victim] if e[2] == codec.MAGIC_NORMAL] == [body(i) for i in range(total)]


def test_a_wiped_member_votes_for_a_survivor_holding_what_the_group_had_before_it_caught_up(make_cluster):
    """A member restarts with an empty store, learns the group's term and end, and then the
    leader dies before pushing it anything (its dispatcher to that member is stopped). The
    survivor holds everything the group had, but needs the wiped member's vote: waiting to
    catch up first would leave the group without a leader for good (CI met it with a new
    group whose third member started late). The wiped member votes for it, and then catches up
    from it."""
    import shutil
    import signal

    c = make_cluster(3, **OPTS)
    lead = c.wait_leader(timeout=60)
    append(c, 0, 100)
    c.wait_converged(timeout=30)
    victim, survivor = (n for n in c.nodes if n != lead)
    dispatcher = c.nodes[lead].role_pids()[f"dispatcher-{victim}"]
    c.nodes[victim].stop()
    os.kill(dispatcher, signal.SIGSTOP)  # the supervisor's watchdog would restart it after 10 s
    text = _restart_with(c, victim, lambda store: shutil.rmtree(store))
    assert "once entries up to" in text, text[-3000:]
    tv = _term_file(c.nodes[victim])
    assert int(tv["catchUpIndex"]) == c.metadata(survivor).ledger_end_index
    assert block_value(c.nodes[victim], "not_voting") == 3  # catching up: nothing pushed yet
    c.nodes[lead].kill()
    assert c.wait_leader(timeout=60, among=[victim, survivor]) == survivor
    wait_for(lambda: f"caught up to index {tv['catchUpIndex']}" in c.nodes[victim].log_text(), 60,
             "the wiped node to catch up from the new leader")
    append(c, 100, 40)
    wait_for(lambda: block_value(c.nodes[victim], "not_voting") == 0, 30, "the node to vote")
    c.nodes[lead].start()
    logs = same_logs(c, converged_then_stopped(c))
    assert [e[3] for e in logs[victim] if e[2] == codec.MAGIC_NORMAL] == [body(i) for i in range(140)]


def test_a_wiped_leader_that_first_hears_a_member_with_no_entry_waits_for_the_one_with_the_log(make_cluster):
    """The leader loses its disk. One follower has no entry at all (its log was lost too, its
    term file kept, and the leader's dispatcher to it stopped); the other, which holds the log,
    is stopped while the wiped leader restarts. The empty follower answers first: taken for a
    brand-new group at once, the wiped leader would vote and stand freely, and the two empty
    members could elect a leader without the committed entries (the simulator's lost-disk fault
    found it). It waits for every member's answer instead, hears the history, and catches up
    before it votes freely."""
    import shutil
    import signal

    # Longer than any CI stall: the wait must not end before the holder is back.
    c = make_cluster(3, **{**OPTS, "env": {**OPTS["env"], "DLEDGER_NEW_GROUP_PATIENCE_MS": "120000"}})
    lead = c.wait_leader(timeout=60)
    append(c, 0, 100)
    c.wait_converged(timeout=30)
    empty, holder = (n for n in c.nodes if n != lead)
    end = c.metadata(holder).ledger_end_index
    c.nodes[empty].stop()
    for p in Path(c.nodes[empty].store_dir).iterdir():  # the log goes, the term file stays
        if p.name != "currterm":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    os.kill(c.nodes[lead].role_pids()[f"dispatcher-{empty}"], signal.SIGSTOP)
    c.nodes[empty].start()
    wait_for(lambda: (m := c.metadata(empty)) is not None and m.term >= 1 and m.ledger_end_index == -1, 30,
             "the emptied follower to answer with no entry")
    c.nodes[holder].signal(signal.SIGSTOP)  # first: with the leader gone it would lead and push
    try:
        c.nodes[lead].stop()
        shutil.rmtree(c.nodes[lead].store_dir)
        seen = len(c.nodes[lead].log_text())
        c.nodes[lead].start()
        wait_for(lambda: f"{empty} is in term" in c.nodes[lead].log_text()[seen:], 30,
                 "the emptied follower's answer to reach the wiped leader")
    finally:
        c.nodes[holder].signal(signal.SIGCONT)
    wait_for(lambda: "votes from term" in c.nodes[lead].log_text()[seen:], 30, "the wiped node to decide")
    text = c.nodes[lead].log_text()[seen:]
    assert "once entries up to" in text, text[-3000:]
    assert int(_term_file(c.nodes[lead])["catchUpIndex"]) >= end
    append(c, 100, 40)
    logs = same_logs(c, converged_then_stopped(c))
    for nid in c.nodes:
        assert [e[3] for e in logs[nid] if e[2] == codec.MAGIC_NORMAL] == [body(i) for i in range(140)], nid


def test_leader_that_reads_a_damaged_entry_steps_down_and_repairs(make_cluster):
    """Bit rot under a running leader: a GET of the entry answers DISK_ERROR (never the bad
    bytes), the leader stops voting, steps down before cutting its log (its dispatchers
    must never push a cut log), a new leader is elected without it, and it gets the range back
    from that leader. Appends go on through the failover."""
    from ipc import protocol as P
    from ipc.codes import ResponseCode

    c = make_cluster(3, **OPTS)
    lead = c.wait_leader(timeout=60)
    append(c, 0, 600)
    c.wait_converged(timeout=30)
    bad = flip_body_byte(c.nodes[lead])  # in place: the running leader maps this file
    w = Writer(c, 600)
    w.start()
    try:
        r = c.request(lead, P.GetRequest(c.group, lead, bad, 1, request_id=7), timeout=10)
        assert isinstance(r, P.ErrorResponse) and r.code == ResponseCode.DISK_ERROR, r
        assert "repairing from peers" in r.reason
        wait_for(lambda: c.leader() not in (None, lead), 60, "a leader other than the damaged one")
        wait_for(lambda: block_value(c.nodes[lead], "repair_index") == -1, 60, "the repair to finish")
        wait_for(lambda: w.next >= 800, 60, "appends to go on")
    finally:
        total = w.done()
    text = c.nodes[lead].log_text()
    assert f"entry {bad} is damaged" in text and f"DAMAGED committed entries from index {bad}" in text
    assert text.index("does not vote or stand") < text.index(f"DAMAGED committed entries from index {bad}")
    wait_for(lambda: block_value(c.nodes[lead], "not_voting") == 0, 30, "the old leader to vote again")
    logs = same_logs(c, converged_then_stopped(c))
    assert [e[3] for e in logs[lead] if e[2] == codec.MAGIC_NORMAL] == [body(i) for i in range(total)]


def test_leader_damaged_while_down_rejoins_as_a_repairing_follower(make_cluster):
    c = make_cluster(3, **OPTS)
    lead = c.wait_leader(timeout=60)
    append(c, 0, 600)
    c.wait_converged(timeout=30)
    c.nodes[lead].stop()
    bad = delete_middle_segment(c.nodes[lead])
    new = c.wait_leader(timeout=60, among=[n for n in c.nodes if n != lead])
    w = Writer(c, 600)
    w.start()
    try:
        c.nodes[lead].start()
        wait_for(lambda: f"DAMAGED committed entries from index {bad}" in c.nodes[lead].log_text(), 60,
                 "the old leader to find the damage")
        wait_for(lambda: block_value(c.nodes[lead], "repair_index") == -1, 60, "the repair to finish")
        wait_for(lambda: w.next >= 800, 60, "appends to go on")
    finally:
        total = w.done()
    assert new != lead
    wait_for(lambda: block_value(c.nodes[lead], "not_voting") == 0, 30, "the old leader to vote again")
    logs = same_logs(c, converged_then_stopped(c))
    assert [e[3] for e in logs[lead] if e[2] == codec.MAGIC_NORMAL] == [body(i) for i in range(total)]


def _compacting_kv_group(make_cluster, **extra):
    """A KV group whose retention trims every log it can (snapshots every 200 entries, 64 KiB
    data files), with 1,200 keys written; returns it and a follower."""
    from ipc.client import KVClient

    c = make_cluster(3, state_machine="kv", snapshot_threshold=200, data_file_size=64 * 1024,
                     max_body_size=16000, file_reserved_hours=0, disk_space_ratio_to_clean=0.0001, **extra)
    lead = c.wait_leader(timeout=60)
    with KVClient(c.peers, group=c.group, timeout=15.0) as kv:
        for i in range(1200):
            kv.put(b"k%05d" % i, b"%d-" % i + b"x" * 200)
    return c, next(n for n in c.nodes if n != lead)


def _leads_with_every_key(c, victim: str) -> None:
    """The repaired node takes the lead, and its state machine answers every key written."""
    from ipc.client import KVClient

    c.wait_converged(timeout=60)
    with DLedgerClient(c.peers, group=c.group, timeout=15.0) as cl:
        transfer_to(cl, victim, timeout=30)
    assert c.wait_leader(timeout=60) == victim  # its applier answers the reads below
    with KVClient(c.peers, group=c.group, timeout=15.0) as kv:
        assert kv.get(b"k00007").value.startswith(b"7-")
        assert len(kv.scan(b"k0", limit=5000)) == 1200


def test_wiped_store_behind_a_compacted_log_installs_a_snapshot_then_votes(make_cluster):
    """The lost disk of a member whose leader's retention no longer has the log's start: it
    catches up by a snapshot install plus the log after it, and votes only then."""
    import shutil

    c, victim = _compacting_kv_group(make_cluster)
    wait_for(lambda: all((m := c.metadata(n)) is not None and m.ledger_begin_index > 1
                         for n in c.nodes if n != victim), 60, "retention to trim the live logs")
    text = _restart_with(c, victim, lambda store: shutil.rmtree(store))
    assert "once entries up to" in text, text[-3000:]
    catch_up = int(_term_file(c.nodes[victim])["catchUpIndex"])
    wait_for(lambda: f"caught up to index {catch_up}" in c.nodes[victim].log_text(), 90,
             "the wiped node to catch up")
    assert "installed the leader's snapshot" in c.nodes[victim].log_text()
    wait_for(lambda: block_value(c.nodes[victim], "not_voting") == 0, 30, "the node to vote")
    _leads_with_every_key(c, victim)


def test_damaged_follower_of_an_idle_group_is_repaired(make_cluster):
    """No appends after the restart: only the leader's COMMIT messages reach the follower,
    and its answer (it lacks the committed entry) is what makes the leader resend."""
    c = make_cluster(3, **OPTS)
    lead = c.wait_leader(timeout=60)
    append(c, 0, 600)
    c.wait_converged(timeout=30)
    victim = next(n for n in c.nodes if n != lead)
    c.nodes[victim].stop()
    truncate_data_file(c.nodes[victim])
    c.nodes[victim].start()
    wait_for(lambda: "DAMAGED committed entries" in c.nodes[victim].log_text(), 60, "the damage to be found")
    wait_for(lambda: block_value(c.nodes[victim], "repair_index") == -1, 60, "the repair to finish")
    logs = same_logs(c, converged_then_stopped(c))
    assert [e[3] for e in logs[victim] if e[2] == codec.MAGIC_NORMAL] == [body(i) for i in range(600)]



@pytest.mark.parametrize("length", [100_000, 1 << 19], ids=["torn", "power-of-two"])
def test_follower_whose_only_data_file_was_truncated_repairs(make_cluster, length):
    """With data files big enough for the whole log (the default is 1 GiB) a node has one data
    file. Truncated, its length alone looked like a store made with another size: the node
    refused to start ("configured for ...") or, for a power of two, adopted it as its size.
    The store records its sizes, so this is damage, repaired from peers like any other."""
    c = make_cluster(3, **{**OPTS, "data_file_size": 1 << 20})
    lead = c.wait_leader(timeout=60)
    append(c, 0, 600)
    c.wait_converged(timeout=30)
    victim = next(n for n in c.nodes if n != lead)
    c.nodes[victim].stop()
    [f] = data_files(c.nodes[victim])
    os.truncate(f, length)
    c.nodes[victim].start()
    wait_for(lambda: "DAMAGED committed entries" in c.nodes[victim].log_text(), 60, "the damage to be found")
    wait_for(lambda: block_value(c.nodes[victim], "repair_index") == -1, 60, "the repair to finish")
    append(c, 600, 20)
    logs = same_logs(c, converged_then_stopped(c))
    assert [e[3] for e in logs[victim] if e[2] == codec.MAGIC_NORMAL] == [body(i) for i in range(620)]
    assert [f.stat().st_size for f in data_files(c.nodes[victim])] == [1 << 20]


def test_damaged_first_entry_of_a_trimmed_log_drops_it_and_installs_a_snapshot(make_cluster):
    """Retention trimmed every log; then the first entry of a follower's trimmed log rots.
    There is nothing before it to cut after, so the follower drops its whole log (as a lost
    disk) with the repair index recorded, gets the leader's snapshot and the log after it, and
    votes again. (It used to stop: "cannot cut there".)"""
    c, victim = _compacting_kv_group(make_cluster, env=OPTS["env"])
    wait_for(lambda: all((m := c.metadata(n)) is not None and m.ledger_begin_index > 1 for n in c.nodes),
             60, "retention to trim every log")
    node = c.nodes[victim]
    node.stop()
    f = data_files(node)[0]
    off, first, size = entries_in(f)[0]
    with open(f, "r+b") as fh:
        fh.seek(off + codec.BODY_CRC_OFFSET)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0x20]))
    seen = len(node.log_text())
    node.start()
    wait_for(lambda: f"DAMAGED committed entries from index {first}" in node.log_text()[seen:], 60,
             "the scrub to find the damaged first entry")
    wait_for(lambda: block_value(node, "repair_index") == -1, 90, "the repair to finish")
    # The log begins again after a snapshot: the leader's, installed, or one the applier
    # already holds that covers the leader's begin (then the handler resets to it, no transfer).
    text = node.log_text()[seen:]
    assert "cannot cut there" not in text and "log reset to begin after" in text, text[-3000:]
    wait_for(lambda: block_value(node, "not_voting") == 0, 30, "the node to vote again")
    _leads_with_every_key(c, victim)
