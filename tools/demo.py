"""`make run`: the main job, end to end, printed as it happens.

Until the replicated cluster lands (the election and replication issues), this demonstrates
the store a node is built on, and says so: it appends entries (single and batch) into a fresh
store with tiny segment files so rolling happens, closes it, reopens it (recovery), reads
everything back by index, and prints what `dledger dump` would show.
"""

from __future__ import annotations

import shutil
import tempfile

from node.store.segment_store import SegmentStore, StoreConfig


def store_demo() -> int:
    print("DLedger for Python — store demonstration (the cluster demo arrives with replication)")
    d = tempfile.mkdtemp(prefix="dledger-demo-")
    cfg = StoreConfig(store_dir=d, data_file_size=4096, index_file_size=32 * 16)
    try:
        with SegmentStore(cfg) as st:
            r = st.append_leader(b"hello, dledger", term=1)
            print(f"appended index={r.index} term={r.term} pos={r.pos}")
            rs = st.append_leader_batch([b"message-%03d" % i * 8 for i in range(60)], term=1)
            print(f"appended a batch of {len(rs)}: indexes {rs[0].index}..{rs[-1].index}")
            st.set_committed_index(st.ledger_end_index)
            print(f"data files: {len(st.data.files)} x {cfg.data_file_size} B (rolled with BLANK padding)")
        print(f"closed; reopening {d} (recovery scans and verifies the files)")
        with SegmentStore(cfg) as st:
            print(f"recovered begin={st.ledger_begin_index} end={st.ledger_end_index} "
                  f"term={st.ledger_end_term} committed={st.committed_index}")
            bad = [i for i in range(st.ledger_end_index + 1) if st.get(i).index != i]
            for i in (0, 1, st.ledger_end_index):
                e = st.get(i)
                print(f"  get({i}) -> term={e.term} pos={e.pos} body={bytes(e.body)[:24]!r}")
            print("read back all entries:", "OK" if not bad else f"MISMATCH at {bad}")
            return 0 if not bad else 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    return store_demo()


if __name__ == "__main__":
    raise SystemExit(main())
