"""node.core.retention (the decision, as a table) and the store facts it is fed."""

import pytest

from node.core.retention import NOTHING, DataFile, RetentionPlan, RetentionPolicy, plan_retention
from node.store.segment_store import SegmentStore, StoreConfig

NOW = 1_000_000.0
OLD, NEW = NOW - 100 * 3600, NOW - 60  # last written 100 hours / one minute ago
POLICY = RetentionPolicy(file_reserved_hours=72, disk_space_ratio_to_clean=0.85, disk_full_ratio=0.90,
                         max_files=3)

# four files of 100 entries each, the last being written
FILES = [DataFile(0, 99, OLD), DataFile(100, 199, OLD), DataFile(200, 299, NEW), DataFile(300, 350, NEW)]


def plan(files=FILES, ratio=0.87, committed=350, peers=None, policy=POLICY) -> RetentionPlan:
    return plan_retention(files, now_s=NOW, disk_usage_ratio=ratio, committed_index=committed,
                          peer_next_index=peers or {}, policy=policy)


@pytest.mark.parametrize("case, got, want", [
    ("disk below the clean ratio: keep everything", plan(ratio=0.84), NOTHING),
    ("above it: the expired files, oldest first", plan(), RetentionPlan(200, 2)),
    ("never an uncommitted entry", plan(committed=150), RetentionPlan(100, 1)),
    ("nothing committed in the oldest file", plan(committed=50), NOTHING),
    ("a file written recently stops the prefix", plan(files=[FILES[0], FILES[2], FILES[1], FILES[3]]),
     RetentionPlan(100, 1)),
    ("the file being written is never deleted", plan(files=[DataFile(0, 99, OLD)]), NOTHING),
    ("at most max_files per pass",
     plan(policy=RetentionPolicy(72, 0.85, 0.90, max_files=1)), RetentionPlan(100, 1)),
    ("reserved 0 hours: every committed file but the last",
     plan(policy=RetentionPolicy(0, 0.85, 0.90, max_files=9)), RetentionPlan(300, 3)),
    ("a peer that has stored everything does not hold anything back",
     plan(peers={"n1": 351, "n2": 351}), RetentionPlan(200, 2)),
    ("a lagging peer keeps the file it still needs",
     plan(peers={"n1": 351, "n2": 150}), RetentionPlan(100, 1, held_by=("n2",))),
    ("a peer that needs the oldest file keeps them all",
     plan(peers={"n1": 0, "n2": 40}), RetentionPlan(held_by=("n1", "n2"))),
    ("disk at the full ratio: forced past age and peers, stranded peers named",
     plan(ratio=0.95, peers={"n1": 351, "n2": 40}), RetentionPlan(300, 3, forced=True, strands=("n2",))),
    ("forced still never deletes an uncommitted entry", plan(ratio=0.95, committed=120),
     RetentionPlan(100, 1, forced=True)),
])
def test_retention_decision_table(case, got, want):
    assert got == want, case


def test_empty_store_or_one_file_deletes_nothing():
    assert plan(files=[]) == NOTHING
    assert plan(files=FILES[:1], ratio=0.99) == NOTHING


def test_data_file_ranges_are_contiguous_and_end_at_the_ledger_end(tmp_path):
    cfg = StoreConfig(store_dir=str(tmp_path), data_file_size=4096, index_file_size=32 * 64)
    with SegmentStore(cfg) as s:
        assert s.data_file_ranges(10) == []
        s.append_leader_batch([bytes(200)] * 100, 1)
        ranges = s.data_file_ranges(100)
        assert len(ranges) == len(s.data.files) > 3
        assert ranges[0][0] == 0 and ranges[-1][1] == 99
        for (_f1, last1, _), (first2, _l2, _) in zip(ranges, ranges[1:], strict=False):
            assert first2 == last1 + 1
        for (first, last, _), f in zip(ranges, s.data.files, strict=True):  # each entry is in its file
            assert f.start <= s.index_record(first).pos < f.end
            assert f.start <= s.index_record(last).pos < f.end
        assert s.data_file_ranges(2) == ranges[:2]  # a prefix asks for the same answer
        s.set_committed_index(99)
        s.delete_before(ranges[2][0])
        assert s.ledger_begin_index == ranges[2][0]
        assert s.data_file_ranges(100) == ranges[2:]


def test_disk_usage_ratio_is_what_df_reports(tmp_path):
    """df's Use% (used / (used + available)), not (total - available) / total, which reads
    ~70% on this project's CI disks (a large root reserve) and would refuse appends early."""
    import subprocess

    from node.store.segment_store import disk_usage_ratio

    out = subprocess.run(["df", "--output=pcent", str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout.split()[-1]
    assert abs(disk_usage_ratio(tmp_path) * 100 - int(out.rstrip("%"))) <= 1.0, out
