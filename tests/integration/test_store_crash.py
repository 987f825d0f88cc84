"""SIGKILL a process that is appending, at random moments, many times over; after every
reopen the store must hold a clean prefix of what was written — nothing garbled, nothing
committed lost (docs/store.md "Recovery (at open)")."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

from node.store.segment_store import SegmentStore, StoreConfig

CHILD = textwrap.dedent("""
    import random, sys
    sys.path.insert(0, {root!r})
    from node.store.segment_store import SegmentStore, StoreConfig

    def body(i):
        n = (i * 7919) % 900
        return (b"%d:" % i * (n // 3 + 1))[:n]

    def term(i):
        return 1 + i // 500

    s = SegmentStore(StoreConfig(store_dir={path!r}, data_file_size=16384, index_file_size=32 * 64,
                                 flush_interval_ms=3, checkpoint_interval_ms=5))
    s.open()
    print("ready", s.ledger_end_index, flush=True)
    rnd = random.Random({seed})
    while True:
        i = s.ledger_end_index + 1
        if rnd.random() < 0.5:
            s.append_leader(body(i), term(i))
        else:
            k = min(rnd.randrange(1, 20), 500 - i % 500)  # a batch never spans two terms
            s.append_leader_batch([body(j) for j in range(i, i + k)], term(i))
        s.set_committed_index(s.ledger_end_index - 3)
""")


def body(i):
    n = (i * 7919) % 900
    return (b"%d:" % i * (n // 3 + 1))[:n]


def test_store_survives_repeated_sigkill(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rnd = random.Random(42)
    ends = []
    for round_no in range(12):
        script = CHILD.format(root=root, path=str(tmp_path), seed=round_no)
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            line = p.stdout.readline().decode()
            assert line.startswith("ready"), p.stderr.read().decode()
            time.sleep(rnd.uniform(0.02, 0.3))  # let it write; the kill moment is the variable
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        s = SegmentStore(StoreConfig(store_dir=str(tmp_path), data_file_size=16384, index_file_size=32 * 64))
        s.open()
        try:
            end = s.ledger_end_index
            assert s.committed_index <= end
            for i in range(0, end + 1):
                e = s.get(i)
                assert e.index == i and e.term == 1 + i // 500 and bytes(e.body) == body(i), i
            ends.append(end)
        finally:
            s.close()
    assert ends[-1] > ends[0] > 0, ends  # progress across rounds: appends resumed after each crash
