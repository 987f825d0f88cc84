"""Restart with a long log: recovery walks only what the checkpoint does not vouch for, and the
entries below it are checked lazily (the handler's scrub, GET, a dispatcher before it pushes)
-- never served, pushed or acknowledged unchecked (docs/store.md "Recovery").

Bounded by counts, not time: the store's own "recovered" line says how many entries open
walked, which must not depend on the entries below the checkpoint.
"""

from __future__ import annotations

import json
import re

from cluster import read_log, wait_for

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.store import codec
from node.store.base import StoreConfig
from node.store.segment_store import SegmentStore
from node.store.term_vote import TermVoteFile

DATA_FILE = 1 << 18
INDEX_FILE = 1 << 16
SIZES = dict(data_file_size=DATA_FILE, index_file_size=INDEX_FILE, max_body_size=65536)
NO_SCRUB = {"DLEDGER_SCRUB_DELAY_MS": str(10 * 60_000)}  # reads must find the damage first
_WALKED = re.compile(r"recovered begin=(-?\d+) end=(-?\d+) .*\(walked (\d+) entries from (the [\w ]+?);")


def _body(i: int) -> bytes:
    return b"entry-%06d-" % i + bytes([i % 251]) * 200


def _write_store(store_dir, n: int, committed: int) -> list[int]:
    """n entries (term 1) written with the store's writer and closed cleanly (the checkpoint
    names `committed`); returns each entry's data position."""
    with SegmentStore(StoreConfig(str(store_dir), data_file_size=DATA_FILE,
                                  index_file_size=INDEX_FILE)) as s:
        for first in range(0, n, 1000):
            s.append_batch_raw([_body(i) for i in range(first, min(n, first + 1000))], 1)
        s.set_committed_index(committed)
        return [s.index_record(i).pos for i in range(n)]


def _flip_body_byte(store_dir, pos: int) -> None:
    f = store_dir / "data" / f"{pos - pos % DATA_FILE:020d}"
    with open(f, "r+b") as fh:
        fh.seek(pos % DATA_FILE + codec.HEADER_SIZE + 3)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0xFF]))


def _recoveries(log_text: str) -> list[tuple[int, int, int, str]]:
    """(begin, end, entries walked, where the walk started) of every open in a node's log."""
    out = []
    for line in log_text.splitlines():
        try:
            msg = json.loads(line)["msg"]
        except (ValueError, KeyError):
            continue
        m = _WALKED.search(msg)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)))
    return out


def test_open_walks_only_past_the_checkpoint_and_the_scrub_checks_the_rest(make_cluster):
    """A one-node group on a 20,000-entry log (~20 data files): open walks the checkpoint's
    committed entry only (a clean stop: committed = end), then after a SIGKILL with 300 more
    entries appended it walks at most those and the ones the checkpoint did not cover yet --
    never the 20,000 below. The scrub then checks the rest (the block word drops to -1) and
    every entry reads back."""
    c = make_cluster(1, start=False, log_format="json", **SIZES)
    node = c.nodes["n0"]
    n = 20_000
    _write_store(node.store_dir, n, committed=n - 1)
    assert len(list((node.store_dir / "data").iterdir())) >= 15
    node.start()
    wait_for(lambda: c.metadata("n0"), 60, "n0 serving")
    (begin, end, walked, start), = _recoveries(node.log_text())
    assert (begin, end, start) == (0, n - 1, "the checkpoint"), (begin, end, start)
    assert walked == 1, walked  # the committed entry itself: nothing below it

    wait_for(lambda: f"scrub done: entries up to {n - 2} checked" in node.log_text(), 120,
             "the scrub to check every entry below the checkpoint")
    with c.client() as cl:
        for i in (0, n // 2, n - 1):
            assert bytes(cl.get(i).body) == _body(i)
        for _ in range(3):
            cl.append_batch([b"more-%d" % k for k in range(100)])
    node.kill()
    node.start()
    wait_for(lambda: c.metadata("n0"), 60, "n0 serving again")
    rec = _recoveries(node.log_text())[-1]
    assert rec[1] >= n + 300 and rec[3] == "the checkpoint", rec
    # The entries written since the last checkpoint (at most ~1 s old) plus its committed
    # one: a bound that does not grow with the 20,000 entries below.
    assert rec[2] <= 302, rec


def test_a_damaged_entry_below_the_checkpoint_is_never_served(make_cluster):
    """Entry 10's body is damaged; the checkpoint vouches for everything up to 1,999, so open
    does not read entry 10. GET of it never answers SUCCESS (the handler checks every CRC
    before serving), and the node takes the damage path -- from that GET or from its scrub,
    here the GET, as the scrub is held off. A one-member group has no peer to repair from:
    one line naming the entry, exit 1."""
    c = make_cluster(1, start=False, env=NO_SCRUB, **SIZES)
    node = c.nodes["n0"]
    pos = _write_store(node.store_dir, 2000, committed=1999)
    _flip_body_byte(node.store_dir, pos[10])
    node.start()
    answers = []

    def stopped() -> bool:
        r = c.request("n0", P.GetRequest(c.group, "n0", index=10, count=1, request_id=1), timeout=0.2)
        if r is not None:
            answers.append(r)
        return not node.alive

    wait_for(stopped, 60, "n0 to stop on the damaged entry", interval=0.05)
    assert node.proc.returncode == 1
    assert all(a.code != RC.SUCCESS for a in answers), answers
    text = node.log_text()
    assert "committed entry 10 " in text and "dledger server: error: handler:" in text, text[-2000:]
    assert "scrub done" not in text


def test_a_leader_never_pushes_a_damaged_entry_below_its_checkpoint(make_cluster):
    """n0 holds 2,000 committed entries with entry 5 damaged; n1 holds only the first 5, so
    n0 leads and must push from entry 5. The run CRC alone would not stop it (the dispatcher
    computes it over the damaged bytes): the dispatcher checks what recovery left unchecked
    before pushing (the scrub is held off, so the dispatcher is the one to find it): it pushes
    nothing from there and tries again a second later (the handler's scrub is what starts the
    repair). The followers never store entry 5."""
    c = make_cluster(3, start=False, env=NO_SCRUB, **SIZES)
    n0 = c.nodes["n0"]
    pos = _write_store(n0.store_dir, 2000, committed=1999)
    _flip_body_byte(n0.store_dir, pos[5])
    # n1 holds the first 5 (an empty store would count as a lost disk: no vote until caught up)
    _write_store(c.nodes["n1"].store_dir, 5, committed=4)
    for nid in ("n0", "n1"):  # as members that ran before: their term/vote state is there
        TermVoteFile(c.nodes[nid].store_dir).save(1, None)
    for nid in ("n0", "n1"):  # only n0 can win: n1's log is behind it
        c.nodes[nid].start()
    wait_for(lambda: n0.log_text().count("not pushed") >= 2, 60, "n0's dispatcher to refuse the run twice")
    assert n0.alive
    c.nodes["n1"].stop()
    text = n0.log_text()
    assert "committed entry 5 " in text, text[-2000:]
    stored = read_log(c.nodes["n1"].store_dir)  # get() checks every CRC
    assert all(body == _body(i) for i, _t, _m, body in stored), [i for i, *_ in stored]
    assert not any(i >= 5 for i, *_ in stored)
