"""Prometheus metrics of a whole node, served by its supervisor (`--metrics-port P`).

Why this shape: every role already keeps its counters, watermarks and histograms in the shared
state block (lock-free words with one writer, docs/shared_state.md), so no role changes its hot
path for metrics and none holds a prometheus_client object. One process serves them: the
supervisor, which has the block mapped anyway, knows the roles' restarts, and is not on any
request's path. Its HTTP server is prometheus_client's own (a thread); `NodeCollector.collect`
reads the block only when Prometheus scrapes (group reads take the seqlock, counters are whole
words), so nothing is computed between scrapes and nothing spins. The store directory is
measured at scrape time too (a listing of a few segment files and one statvfs).

Every metric is labelled `group` and `node`; per-follower metrics add `peer`. The list, with
alert rules, is docs/metrics.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from ipc.codes import Role
from node.block.shared_state import PEER_ARRAYS, SharedState, monotonic_ms
from node.observe import request_counts
from node.observe.histogram import HistogramSpec, cumulative
from node.observe.status import store_bytes

log = logging.getLogger("dledger.metrics")

_LABELS = ("group", "node")
_PEER_LABELS = ("group", "node", "peer")

# block counter -> (metric stem without _total, help)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("leader_changes", "leader_changes", "times this node saw the group's leader change"),
    ("role_changes", "role_changes", "times this node's role or term changed"),
    ("elections_started", "elections_started", "terms this node started as a candidate (vote rounds)"),
    ("elections_won", "elections_won", "times this node became leader"),
    ("votes_requested", "votes_requested", "vote requests this node sent"),
    ("votes_granted", "votes_granted", "votes this node granted"),
    ("heartbeats_sent", "heartbeats_sent", "heartbeats sent as leader"),
    ("appends", "append_requests", "append requests written as leader (a batch counts once)"),
    ("entries_appended", "appended_entries", "entries written as leader"),
    ("bytes_appended", "appended_bytes", "data-file bytes written as leader"),
    ("append_errors", "append_errors", "appends refused after admission or timed out"),
    ("gets", "get_requests", "GET requests served"),
    ("fetches", "fetch_requests", "FETCH (follow) requests answered, by any role"),
    ("fetched_entries", "fetched_entries", "entries sent in FETCH answers"),
    ("push_requests", "push_requests", "pushes received as follower"),
    ("bad_frames", "bad_frames", "malformed, misdirected or refused (no right) frames on the data port"),
    ("auth_refused", "auth_refused", "CURVE handshakes refused on the data port (a key no one listed)"),
    ("elector_auth_refused", "elector_auth_refused",
     "CURVE handshakes refused on the elector port (not a member's key)"),
    ("commits_published", "commit_advances", "times the committed index moved"),
    ("quorum_advances", "quorum_advances", "times the quorum index moved (ack checker)"),
    ("retention_files_deleted", "retention_deleted_files", "data files deleted by retention"),
    ("entries_applied", "applied_entries", "entries applied to the state machine"),
    ("snapshots_taken", "snapshots_taken", "state machine snapshots taken"),
)


def disk_ratio(store_dir: str | os.PathLike[str]) -> float:
    """How full the store's file system is, as the handler's DISK_FULL check measures it."""
    from node.store.segment_store import disk_usage_ratio

    try:
        return disk_usage_ratio(store_dir)
    except OSError:
        return 0.0


def add_block_histogram(fam: HistogramMetricFamily, values: list[str], spec: HistogramSpec,
                        counts: tuple[int, ...], total: int) -> None:
    """Block histogram (per-bucket counts, +Inf last; sum) -> Prometheus cumulative buckets in
    the metric's base unit."""
    cum = cumulative(counts)
    buckets = [(_le(b * spec.scale), c) for b, c in zip(spec.bounds, cum, strict=False)]
    buckets.append(("+Inf", cum[-1]))
    fam.add_metric(values, buckets, total * spec.scale)


def _le(v: float) -> str:
    return repr(float(v))


class NodeCollector(Collector):
    """Reads one node's state block at scrape time (see the module docstring)."""

    def __init__(self, state: Callable[[], SharedState | None], group: str, node: str,
                 peer_ids: list[str], store_dir: str, version: str = "",
                 restarts: Callable[[], dict[str, int]] | None = None,
                 slot_ids: Callable[[], list[str]] | None = None) -> None:
        self._state = state
        # The follower id of each peer slot (members added later too): the node's slot table.
        self._slot_ids = slot_ids
        self.group, self.node = group, node
        self.peer_ids = peer_ids
        self.store_dir = store_dir
        self.version = version
        self._restarts = restarts or dict

    def describe(self) -> list[Metric]:
        return []  # collected only at scrape time (registering must not read the block)

    def collect(self) -> Iterator[Metric]:
        st = self._state()
        if st is None or st.closed:
            return
        try:
            yield from self._collect(st)
        except Exception:  # noqa: BLE001 - a scrape must never take the supervisor down
            log.exception("metrics: collecting from the state block failed")

    def _collect(self, st: SharedState) -> Iterator[Metric]:
        lv = [self.group, self.node]
        m = st.read_member()
        led = st.read_ledger()
        q = st.read_quorum()
        now = monotonic_ms()

        info = InfoMetricFamily("dledger_build", "this node's software version", labels=_LABELS)
        info.add_metric(lv, {"version": self.version})
        yield info

        role = GaugeMetricFamily("dledger_role", "1 for this node's current role",
                                 labels=[*_LABELS, "role"])
        for r in Role:
            role.add_metric([*lv, r.name], 1.0 if m.role == r else 0.0)
        yield role
        yield _gauge("dledger_is_leader", "1 while this node is the leader", lv,
                     1.0 if m.role == Role.LEADER else 0.0)
        yield _gauge("dledger_term", "current term", lv, m.current_term)
        yield _gauge("dledger_has_leader", "1 while this node knows a leader", lv,
                     1.0 if m.leader_slot >= 0 else 0.0)
        last_change = st.get("last_leader_change_ms")
        if last_change > 0:
            yield _gauge("dledger_leader_change_age_seconds",
                         "seconds since this node last saw the leader change", lv,
                         (now - last_change) / 1000)

        yield _gauge("dledger_ledger_begin_index", "first index in the store (-1: empty)", lv,
                     led.ledger_begin_index)
        yield _gauge("dledger_ledger_end_index", "last index in the store (-1: empty)", lv,
                     led.ledger_end_index)
        yield _gauge("dledger_committed_index", "committed index (-1: none)", lv,
                     led.committed_index)
        yield _gauge("dledger_quorum_index", "index a quorum stored (leader's ack checker)", lv,
                     q.quorum_index)
        yield _gauge("dledger_applied_index",
                     "index applied to the state machine (-1: none or no state machine)", lv,
                     st.get("applied_index"))
        yield _gauge("dledger_pending_appends", "entries written, waiting for a quorum", lv,
                     st.get("pending_appends") if m.role == Role.LEADER else 0)
        yield _gauge("dledger_store_unwritable", "1 while the store refuses writes (disk full "
                     "or error)", lv, 1.0 if st.get("store_unwritable_ms") else 0.0)
        yield _gauge("dledger_repair_index", "while >= 0 the store lost committed entries up "
                     "to this index and fetches them again from the leader (-1: healthy)", lv,
                     st.get("repair_index"))
        yield _gauge("dledger_not_voting", "0 when this node votes and stands; else why not "
                     "(1 store repair, 2 term/vote state lost, 3 catching up after a lost disk)",
                     lv, st.get("not_voting"))

        for field, stem, doc in _COUNTERS:
            c = CounterMetricFamily(f"dledger_{stem}", doc, labels=_LABELS)
            c.add_metric(lv, st.get(field))
            yield c

        restarts = CounterMetricFamily("dledger_role_restarts",
                                       "role processes restarted by the supervisor",
                                       labels=[*_LABELS, "role"])
        for name, n in sorted(self._restarts().items()):
            restarts.add_metric([*lv, name], n)
        yield restarts

        req = CounterMetricFamily("dledger_requests", "data-port replies by request type and "
                                  "response code", labels=[*_LABELS, "type", "code"])
        for t, code, n in request_counts.nonzero(st.read_array("requests")):
            req.add_metric([*lv, t, code], n)
        yield req

        for name, metric, doc in (
            ("append_latency_ms", "dledger_append_latency_seconds",
             "append request received -> committed (leader, one per reply)"),
            ("append_batch_entries", "dledger_append_batch_entries",
             "entries per leader store write"),
            ("fsync_us", "dledger_fsync_seconds", "fdatasync of the data and index files"),
        ):
            spec, counts, total = st.read_histogram(name)
            fam = HistogramMetricFamily(metric, doc, labels=list(_LABELS))
            add_block_histogram(fam, lv, spec, counts, total)
            yield fam

        yield _gauge("dledger_store_bytes", "bytes the store's segment files take on disk", lv,
                     store_bytes(self.store_dir))
        yield _gauge("dledger_disk_usage_ratio", "how full the store's file system is (0-1)", lv,
                     disk_ratio(self.store_dir))

        yield from self._peers(st, lv, m, led, now)

    def _peers(self, st: SharedState, lv: list[str], m: Any, led: Any, now: int
               ) -> Iterator[Metric]:
        leading = m.role == Role.LEADER
        end_pos = st.get("ledger_end_pos")
        fams = {
            "match": GaugeMetricFamily("dledger_peer_match_index",
                                       "follower's last index known to match (leader)",
                                       labels=list(_PEER_LABELS)),
            "lag": GaugeMetricFamily("dledger_peer_lag_entries",
                                     "leader's end index minus the follower's match index",
                                     labels=list(_PEER_LABELS)),
            "lag_bytes": GaugeMetricFamily("dledger_peer_lag_bytes",
                                           "data bytes the follower does not hold yet (leader)",
                                           labels=list(_PEER_LABELS)),
            "alive": GaugeMetricFamily("dledger_peer_alive", "1 while the follower answers "
                                       "(leader)", labels=list(_PEER_LABELS)),
            "ack_age": GaugeMetricFamily("dledger_peer_last_ack_age_seconds",
                                         "seconds since the follower last answered (leader)",
                                         labels=list(_PEER_LABELS)),
        }
        counters = {
            "pushes_sent": CounterMetricFamily("dledger_peer_pushes", "pushes sent to the "
                                               "follower", labels=list(_PEER_LABELS)),
            "entries_pushed": CounterMetricFamily("dledger_peer_pushed_entries", "entries "
                                                  "pushed to the follower",
                                                  labels=list(_PEER_LABELS)),
            "bytes_pushed": CounterMetricFamily("dledger_peer_pushed_bytes", "bytes pushed "
                                                "to the follower", labels=list(_PEER_LABELS)),
        }
        hist_name = PEER_ARRAYS[0].name
        hist = HistogramMetricFamily("dledger_replication_latency_seconds",
                                     "APPEND push sent -> answered, per follower",
                                     labels=list(_PEER_LABELS))
        ids = self._slot_ids() if self._slot_ids is not None else self.peer_ids
        held = [i for i, x in enumerate(ids) if x] if self._slot_ids is not None else None
        for p in st.read_peers(slots=held):
            pv = [*lv, ids[p.slot] if p.slot < len(ids) else str(p.slot)]
            for key, fam in counters.items():
                fam.add_metric(pv, getattr(p, key))
            spec, counts, total = st.read_histogram(hist_name, p.slot)
            add_block_histogram(hist, pv, spec, counts, total)
            if not leading or p.match_term != m.current_term:
                continue  # a follower's records are from an earlier leadership
            fams["match"].add_metric(pv, p.match_index)
            fams["lag"].add_metric(pv, max(0, led.ledger_end_index - p.match_index))
            if p.match_pos > 0 or p.match_index < 0:
                fams["lag_bytes"].add_metric(pv, max(0, end_pos - p.match_pos))
            fams["alive"].add_metric(pv, 1.0 if p.alive else 0.0)
            if p.last_ack_ms > 0:
                fams["ack_age"].add_metric(pv, (now - p.last_ack_ms) / 1000)
        yield from fams.values()
        yield from counters.values()
        yield hist


def _gauge(name: str, doc: str, lv: list[str], value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(_LABELS))
    g.add_metric(lv, value)
    return g


class MetricsServer:
    """prometheus_client's HTTP server (a thread) on `host:port`, serving one NodeCollector."""

    def __init__(self, host: str, port: int, collector: NodeCollector) -> None:
        from prometheus_client import start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        # Raises OSError (EADDRINUSE, EACCES...) here, before any role starts.
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port
        log.info("metrics at http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        """Stop serving (returns within serve_forever's 0.5 s poll) and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2)
