"""Metrics in the shared block (docs/metrics.md): histogram bucket logic, the request matrix, the
Prometheus collector over a real block, the METADATA status trailer and `health`'s verdict."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from ipc.codes import Role
from node.block import shared_state as ss
from node.block.shared_state import NotTheWriter, SharedState
from node.config import ConfigError, NodeConfig
from node.observe import request_counts
from node.observe.histogram import LATENCY_MS, bucket_index, cumulative, quantile
from node.observe.metrics import NodeCollector
from tools.commands.group_status import NodeAnswer, read_group
from tools.commands.health import verdict

_names = itertools.count()


@pytest.fixture
def block() -> Iterator[SharedState]:
    st = SharedState.create(f"dl_m{os.getpid()}_{next(_names)}", n_peers=3, self_slot=0)
    try:
        yield st
    finally:
        st.unlink()
        st.close()


# ---- histogram bucket logic ------------------------------------------------------------------

@pytest.mark.parametrize("value, bucket", [
    (0, 0), (1, 0),            # le=1 is inclusive, as Prometheus' le
    (2, 1), (3, 2), (5, 2), (6, 3),
    (5000, 11), (5001, 12),    # above the last bound: +Inf
])
def test_bucket_index_is_prometheus_le(value: int, bucket: int) -> None:
    assert bucket_index(LATENCY_MS, value) == bucket


def test_cumulative_and_quantile() -> None:
    counts = [0] * (len(LATENCY_MS) + 1)
    counts[2] = 98  # (2, 5]
    counts[6] = 2   # (50, 100]
    assert cumulative(counts)[-1] == 100 and cumulative(counts)[2] == 98
    assert 2 < quantile(LATENCY_MS, counts, 0.5) <= 5
    assert 50 < quantile(LATENCY_MS, counts, 0.99) <= 100
    assert quantile(LATENCY_MS, [0] * 13, 0.99) is None
    only_inf = [0] * 12 + [3]
    assert quantile(LATENCY_MS, only_inf, 0.99) == LATENCY_MS[-1]


def test_histogram_words_on_a_real_block(block: SharedState) -> None:
    h = block.histogram_writer("append_latency_ms")
    for v in (0, 1, 3, 7000, -5):
        h.observe(v)
    spec, counts, total = block.read_histogram("append_latency_ms")
    assert spec.bounds == LATENCY_MS and len(counts) == len(LATENCY_MS) + 1
    assert counts[0] == 3 and counts[2] == 1 and counts[-1] == 1  # -5 counts as 0
    assert total == 0 + 1 + 3 + 7000
    p = block.peer_histogram_writer(1, "replication_latency_ms")
    p.observe(12)
    _spec, pc, ps = block.read_histogram("replication_latency_ms", 1)
    assert pc[bucket_index(LATENCY_MS, 12)] == 1 and ps == 12
    assert sum(block.read_histogram("replication_latency_ms", 2)[1]) == 0  # records are apart


def test_arrays_do_not_overlap_fields_or_each_other() -> None:
    spans = [(f.offset, 8) for f in ss.LAYOUT] + [(a.offset, 8 * a.count) for a in ss.ARRAYS]
    spans.sort()
    for (o1, n1), (o2, _n2) in itertools.pairwise(spans):
        assert o1 + n1 <= o2
    assert spans[-1][0] + spans[-1][1] <= ss.PEERS_OFFSET
    peer = sorted([(f.offset, 8) for f in ss.PEER_LAYOUT] + [(a.offset, 8 * a.count) for a in ss.PEER_ARRAYS])
    for (o1, n1), (o2, _n2) in itertools.pairwise(peer):
        assert o1 + n1 <= o2
    assert peer[-1][0] + peer[-1][1] <= ss.PEER_STRIDE


def test_array_writers_are_checked(block: SharedState) -> None:
    other = SharedState.attach(block.name, role="elector")
    try:
        with pytest.raises(NotTheWriter):
            other.histogram_writer("append_latency_ms")
        with pytest.raises(NotTheWriter):
            other.request_counter()
    finally:
        other.close()
    d1 = SharedState.attach(block.name, role="dispatcher[1]")
    try:
        d1.peer_histogram_writer(1, "replication_latency_ms")
        with pytest.raises(NotTheWriter):
            d1.peer_histogram_writer(2, "replication_latency_ms")
    finally:
        d1.close()


def test_request_matrix_counts_replies_by_request_type_and_code(block: SharedState) -> None:
    rc = block.request_counter()
    rc.count_reply(P.AppendResponse(RC.SUCCESS, "g", 1, "n0", 5, 0))
    rc.count_reply(P.AppendResponse(RC.SUCCESS, "g", 1, "n0", 6, 0))
    rc.count_reply(P.ErrorResponse(RC.NOT_LEADER, "g", 1, "", "", int(P.MsgType.BATCH_APPEND)))
    rc.count_reply(P.ErrorResponse(RC.UNEXPECTED_ARGUMENT, "g", 1, "", "bad", 0))  # unreadable request
    rc.count_reply(P.PushResponse(RC.SUCCESS, "g", 1, "n0", 1, 0, 1, -1, -1))
    cells = {(t, c): n for t, c, n in request_counts.nonzero(block.read_array("requests"))}
    assert cells == {("APPEND", "SUCCESS"): 2, ("BATCH_APPEND", "NOT_LEADER"): 1,
                     ("OTHER", "UNEXPECTED_ARGUMENT"): 1, ("PUSH", "SUCCESS"): 1}


def test_write_member_counts_elections_and_leader_changes(block: SharedState) -> None:
    block.write_member(role=Role.CANDIDATE, current_term=1)
    block.write_member(role=Role.LEADER, leader_slot=0)
    block.write_member(role=Role.LEADER)  # no change: nothing counted
    block.write_member(role=Role.FOLLOWER, current_term=2, leader_slot=2)
    block.write_member(leader_slot=-1)  # leader lost: not a change to count
    assert block.get("elections_started") == 1
    assert block.get("elections_won") == 1
    assert block.get("leader_changes") == 2
    assert block.get("last_leader_change_ms") > 0


# ---- the collector on a real block -----------------------------------------------------------

def _scrape(block: SharedState, tmp_path: Path, restarts: dict[str, int] | None = None) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(NodeCollector(lambda: block, "g1", "n0", ["n0", "n1", "n2"], str(tmp_path),
                               "9.9", lambda: restarts or {}))
    text = generate_latest(reg).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict, name: str, **labels: str) -> float:
    want = {("group", "g1"), ("node", "n0"), *labels.items()}
    hits = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_collector_reads_the_block_at_scrape_time(block: SharedState, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "00000000000000000000").write_bytes(b"x" * 8192)
    block.write_member(role=Role.CANDIDATE, current_term=3)
    block.write_member(role=Role.LEADER, leader_slot=0)
    block.write_ledger(ledger_begin_index=0, ledger_end_index=100, ledger_end_term=3, committed_index=90)
    block.set("ledger_end_pos", 10_000)
    block.write_peer(1, match_index=95, match_term=3, alive=True, last_ack_ms=ss.monotonic_ms())
    block.set_peer(1, "match_pos", 9_000)
    block.write_peer(2, match_index=40, match_term=2, alive=False)  # an older leadership's record
    block.histogram_writer("append_latency_ms").observe(3)
    block.request_counter().count(int(P.MsgType.GET), int(RC.SUCCESS))
    s = _scrape(block, tmp_path, {"handler": 2})
    assert _get(s, "dledger_is_leader") == 1 and _get(s, "dledger_term") == 3
    assert _get(s, "dledger_role", role="LEADER") == 1 and _get(s, "dledger_role", role="FOLLOWER") == 0
    assert _get(s, "dledger_committed_index") == 90 and _get(s, "dledger_ledger_end_index") == 100
    assert _get(s, "dledger_peer_lag_entries", peer="n1") == 5
    assert _get(s, "dledger_peer_lag_bytes", peer="n1") == 1_000
    assert not any(n == "dledger_peer_lag_entries" and ("peer", "n2") in ls for n, ls in s)
    assert _get(s, "dledger_elections_won_total") == 1 and _get(s, "dledger_leader_changes_total") == 1
    assert _get(s, "dledger_role_restarts_total", role="handler") == 2
    assert _get(s, "dledger_requests_total", type="GET", code="SUCCESS") == 1
    assert _get(s, "dledger_append_latency_seconds_bucket", le="0.005") == 1
    assert _get(s, "dledger_append_latency_seconds_bucket", le="0.002") == 0
    assert _get(s, "dledger_append_latency_seconds_count") == 1
    assert _get(s, "dledger_append_latency_seconds_sum") == pytest.approx(0.003)
    assert _get(s, "dledger_store_bytes") >= 8192
    assert 0 <= _get(s, "dledger_disk_usage_ratio") <= 1
    assert _get(s, "dledger_build_info", version="9.9") == 1


def test_collector_of_a_closed_block_yields_nothing(tmp_path: Path) -> None:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(NodeCollector(lambda: None, "g", "n0", ["n0"], str(tmp_path)))
    assert generate_latest(reg) == b""


# ---- METADATA status trailer -----------------------------------------------------------------

def _meta(status: P.NodeStatus | None) -> P.MetadataResponse:
    return P.MetadataResponse(RC.SUCCESS, "g", 4, "n0", "n1", Role.FOLLOWER, 0, 10, 9,
                              [P.PeerInfo("n0", "127.0.0.1:1", 10), P.PeerInfo("n1", "127.0.0.1:3", 9)],
                              7, status)


def test_status_trailer_round_trips_and_old_frames_still_decode() -> None:
    st = P.NodeStatus("0.1.0", 123, 0.25, 1500, -1, 4096, tuple(range(13)))
    assert P.decode(P.encode(_meta(st))) == _meta(st)
    plain = P.encode(_meta(None))
    assert P.decode(plain) == _meta(None)  # a frame without the trailer (older nodes)
    assert P.encode(_meta(st)).startswith(plain)  # the trailer only appends
    assert P.decode(P.encode(P.MetadataRequest("g", "n0", 3, True))).want_status is True
    old_req = P.encode(P.MetadataRequest("g", "n0", 3))
    assert P.decode(old_req).want_status is False
    assert old_req == P.encode(P.MetadataRequest("g", "n0", 3, False))  # byte for byte


@pytest.mark.parametrize("cut", [1, 8, 30, 40])
def test_truncated_status_trailer_is_a_protocol_error(cut: int) -> None:
    frame = P.encode(_meta(P.NodeStatus("0.1.0", 1, 0.5, 1, 1, 1, (1, 2, 3))))
    with pytest.raises(P.ProtocolError):
        P.decode(frame[:-cut])


# ---- config ----------------------------------------------------------------------------------

@pytest.mark.parametrize("port, problem", [
    (-1, "must be 0 (off) or a TCP port 1-65535"), (65536, "must be 0 (off) or a TCP port 1-65535"),
    (20911, "is this node's data port"), (20912, "is this node's elector port"),
])
def test_bad_metrics_port_is_a_config_problem(port: int, problem: str) -> None:
    cfg = NodeConfig(id="n0", peers="n0-127.0.0.1:20911", store_dir="/tmp/x", metrics_port=port)
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    assert any(m.startswith("metrics_port:") and problem in m for m in e.value.problems)


# ---- health's verdict ------------------------------------------------------------------------

def _answer(nid: str, role: Role | None, term: int = 2, end: int = 100,
            matches: dict[str, int] | None = None, members: tuple[str, ...] = ("n0", "n1", "n2")) -> NodeAnswer:
    if role is None:
        return NodeAnswer(nid, "h:1")
    peers = [P.PeerInfo(k, "h:1", (matches or {}).get(k, end)) for k in members]
    return NodeAnswer(nid, "h:1", P.MetadataResponse(RC.SUCCESS, "g", term, "", nid, role, 0, end, end,
                                                     peers))


def _moved(nid: str, role: Role) -> NodeAnswer:
    """An answer whose member set puts n1 at h:2 (--peers says h:1)."""
    peers = [P.PeerInfo("n0", "h:1", 100), P.PeerInfo("n1", "h:2", 100)]
    return NodeAnswer(nid, "h:1", P.MetadataResponse(RC.SUCCESS, "g", 2, "", nid, role, 0, 100, 100, peers))


@pytest.mark.parametrize("answers, ok, why", [
    ([_answer("n0", Role.LEADER, matches={"n0": 100, "n1": 99, "n2": 100}),
      _answer("n1", Role.FOLLOWER), _answer("n2", Role.FOLLOWER)], True, "leader n0 term 2, 3/3 alive, max lag 1"),
    ([_answer("n0", Role.LEADER, matches={"n0": 100, "n1": 99, "n2": 0}),
      _answer("n1", Role.FOLLOWER), _answer("n2", None)], True, "down: n2"),  # a dead node's lag is not judged
    ([_answer("n0", Role.LEADER), _answer("n1", None), _answer("n2", None)], False, "no quorum: 1/3"),
    ([_answer("n0", Role.CANDIDATE), _answer("n1", Role.FOLLOWER), _answer("n2", None)], False, "no leader"),
    ([_answer("n0", Role.LEADER), _answer("n1", Role.LEADER), _answer("n2", None)], False,
     "2 nodes claim to lead term 2"),
    ([_answer("n0", Role.LEADER, term=3, matches={"n1": 100, "n2": 100}), _answer("n1", Role.LEADER, term=2),
      _answer("n2", Role.FOLLOWER, term=3)], True, "leader n0 term 3"),  # a stale leader of term 2
    ([_answer("n0", Role.LEADER, matches={"n0": 100, "n1": 50, "n2": 100}),
      _answer("n1", Role.FOLLOWER), _answer("n2", Role.FOLLOWER)], False, "follower n1 lags 50 entries"),
    # a node started with a peers string naming a 4th member: it never joins, and says so
    ([_answer("n0", Role.LEADER), _answer("n1", Role.FOLLOWER),
      _answer("n2", Role.CANDIDATE, term=9, members=("n0", "n1", "n2", "n3"))], False,
     "members disagree on the member set: n0, n1 list n0-h:1, n1-h:1, n2-h:1; n2 list n0-h:1, n1-h:1, n2-h:1, n3-h:1"),
    # the members agree on a set without n2: it was removed online (docs/operations.md
    # "Membership changes"), and a --peers string written before still names it: healthy
    ([_answer("n0", Role.LEADER, members=("n0", "n1")), _answer("n1", Role.FOLLOWER, members=("n0", "n1")),
      _answer("n2", None)], True, "leader n0 term 2"),
    # ... but the same id at another address than --peers says is a wrong string
    ([_moved("n0", Role.LEADER), _moved("n1", Role.FOLLOWER), _answer("n2", None)], False,
     "the group's members are n0-h:1, n1-h:2, not the --peers given"),
])
def test_health_verdict(answers: list[NodeAnswer], ok: bool, why: str) -> None:
    healthy, line = verdict(read_group(answers), 3, max_lag=10)
    assert healthy is ok and why in line, line
    assert "\n" not in line


def test_dashboard_and_docs_name_only_metrics_the_collector_exports(block: SharedState,
                                                                   tmp_path: Path) -> None:
    """docs/metrics.md and docs/grafana-dashboard.json cannot drift from node/observe/metrics.py."""
    import re

    block.write_member(role=Role.LEADER, current_term=1, leader_slot=0)
    block.write_peer(1, match_index=1, match_term=1, alive=True, last_ack_ms=1)
    block.write_peer(2, match_index=1, match_term=1, alive=True, last_ack_ms=1)
    block.set_peer(1, "match_pos", 1)
    block.set_peer(2, "match_pos", 1)
    block.set("last_leader_change_ms", 1)
    block.request_counter().count(int(P.MsgType.APPEND), int(RC.SUCCESS))
    exported = {name for name, _ls in _scrape(block, tmp_path, {"handler": 0})}
    repo = Path(__file__).resolve().parents[2]
    for doc in ("docs/metrics.md", "docs/grafana-dashboard.json"):
        text = (repo / doc).read_text()
        names = set(re.findall(r"\bdledger_[a-z_]+[a-z]", text))
        # table shorthand "`dledger_ledger_begin_index` / `_end_index`" names the first in full
        missing = sorted(n for n in names if n not in exported
                         and f"{n}_total" not in exported and f"{n}_bucket" not in exported)
        assert not missing, f"{doc} names metrics that are not exported: {missing}"
