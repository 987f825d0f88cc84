"""The `dledger` sink against a real group: rows in = entries appended, bodies equal and in
order; a task that fails after part of its rows were read, and a driver commit that dies after
part of a batch was appended, leave every row in the log exactly once after the query is
restarted from its checkpoint; a session the leader no longer knows is resolved from the log,
appending only what the log lacks; bad sink options fail before any job.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.functions import udf
from pyspark.sql.types import StringType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from cluster import Cluster  # noqa: E402

from ipc.client.writer import SessionWriter  # noqa: E402

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("sinkgroup"), 3, data_file_size=32 << 20,
                index_file_size=4 << 20)
    c.start()
    try:
        c.wait_leader(30)
        yield c
    finally:
        c.close()


def _log_bodies(group: Cluster) -> list[bytes]:
    """Every NORMAL entry's body, in log order (read with the plain client)."""
    with group.client() as cl:
        m = cl.metadata()
        end = m.node(m.leader_id).committed_index
        return [e.body for e in cl.get_range(0, end + 1) if e.type == "NORMAL"] if end >= 0 else []


def _source(spark: SparkSession, tmp: Path, rows: list[str], name: str) -> str:
    """A directory of JSON lines a file stream reads as one micro-batch."""
    d = tmp / name
    d.mkdir()
    (d / "part-0.json").write_text("".join(json.dumps({"k": r}) + "\n" for r in rows))
    return str(d)


def _run(spark: SparkSession, df, peers: str, ck: Path, **opts: str) -> None:  # noqa: ANN001
    q = (df.writeStream.format("dledger").option("peers", peers)
         .option("checkpointLocation", str(ck)).options(**opts).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert not q.isActive
    if q.exception() is not None:
        raise q.exception()


def test_batch_write_appends_one_entry_per_row(spark: SparkSession, group: Cluster) -> None:
    before = _log_bodies(group)
    rows = [(f"row-{i}".encode(), i) for i in range(1500)]
    (spark.createDataFrame(rows, "payload binary, n int").repartition(3, "n")
     .sortWithinPartitions("n").write.format("dledger").option("peers", group.peers)
     .option("bodyColumn", "payload").option("batchEntries", "400").mode("append").save())
    added = _log_bodies(group)[len(before):]
    assert sorted(added) == sorted(r[0] for r in rows) and len(added) == len(rows)


def test_the_documented_save_with_no_mode_appends(spark: SparkSession, group: Cluster) -> None:
    """`df.write.format("dledger").option("peers", P).save()` as written: Spark's default mode
    (ErrorIfExists) is refused for Python data sources, so ours appends when no mode is chosen
    (tools/pipeline/write_mode.py); a chosen mode passes through (overwrite is refused)."""
    before = _log_bodies(group)
    spark.createDataFrame([(b"plain-save-%d" % i,) for i in range(5)], "body binary") \
        .write.format("dledger").option("peers", group.peers).save()
    assert sorted(_log_bodies(group)[len(before):]) == [b"plain-save-%d" % i for i in range(5)]
    with pytest.raises(Exception, match="(?i)overwrite"):
        spark.createDataFrame([(b"x",)], "body binary").write.format("dledger") \
            .option("peers", group.peers).mode("overwrite").save()


def test_stream_sink_exactly_once_through_a_failed_task(spark: SparkSession, group: Cluster,
                                                        tmp_path: Path) -> None:
    """A UDF fails its task's first attempt after the sink has read part of the rows; the
    query fails; restarted from its checkpoint, the batch runs again and is appended once."""
    marker = tmp_path / "failed-once"
    rows = [f"t-{i}" for i in range(800)]
    src = _source(spark, tmp_path, rows, "in")

    def fail_once_py(k):  # noqa: ANN001, ANN202 - no hints: Spark would read them as a pandas UDF's
        if k == "t-400" and not marker.exists():
            marker.write_text("x")
            raise RuntimeError("injected task failure")
        return k

    fail_once = udf(fail_once_py, StringType(), useArrow=False)

    def df():  # noqa: ANN202
        return spark.readStream.schema("k string").json(src).select(fail_once("k").alias("body"))

    before = len(_log_bodies(group))
    with pytest.raises(Exception, match="injected task failure"):
        _run(spark, df(), group.peers, tmp_path / "ck")
    assert marker.exists() and len(_log_bodies(group)) == before  # tasks write nothing
    _run(spark, df(), group.peers, tmp_path / "ck")
    assert _log_bodies(group)[before:] == [r.encode() for r in rows]


def test_commit_dying_mid_batch_is_resent_under_its_session(spark: SparkSession, group: Cluster,
                                                            tmp_path: Path) -> None:
    rows = [f"c-{i}" for i in range(1000)]
    src = _source(spark, tmp_path, rows, "in")

    def df():  # noqa: ANN202
        return spark.readStream.schema("k string").json(src).selectExpr("k AS body")

    before = len(_log_bodies(group))
    with pytest.raises(Exception, match="injected failure after 300 entries"):
        _run(spark, df(), group.peers, tmp_path / "ck", batchEntries="100",
             testFailAfterEntries="300")
    assert _log_bodies(group)[before:] == [r.encode() for r in rows[:300]]  # part of it is in
    state = json.loads((tmp_path / "ck" / "dledger-sink" / "batch-0.json").read_text())
    assert state["done"] is False and state["count"] == 1000
    # The restarted query re-runs batch 0: the first 300 are answered from the log, not rewritten.
    _run(spark, df(), group.peers, tmp_path / "ck", batchEntries="100")
    assert _log_bodies(group)[before:] == [r.encode() for r in rows]
    assert json.loads((tmp_path / "ck" / "dledger-sink" / "batch-0.json").read_text())["done"] is True
    # A third run has nothing to do (batch 0 is in Spark's commit log and in ours).
    _run(spark, df(), group.peers, tmp_path / "ck", batchEntries="100")
    assert len(_log_bodies(group)) == before + len(rows)


def test_a_session_the_leader_forgot_is_resolved_from_the_log(spark: SparkSession, tmp_path: Path) -> None:
    """The commit dies after 300 of 1,000 rows; other writers then evict its session from the
    leader's table (max_sessions 2). The re-run's resend is answered SESSION_EXPIRED: the sink
    reads from the log which of the batch's rows that session stored (the 300), and appends
    only the other 700 under a new session."""
    c = Cluster(tmp_path / "c", 3, data_file_size=32 << 20, index_file_size=4 << 20, max_sessions=2)
    c.start()
    try:
        c.wait_leader(30)
        rows = [f"e-{i}" for i in range(1000)]
        src = _source(spark, tmp_path, rows, "in")

        def df():  # noqa: ANN202
            return spark.readStream.schema("k string").json(src).selectExpr("k AS body")

        with pytest.raises(Exception, match="injected failure after 300 entries"):
            _run(spark, df(), c.peers, tmp_path / "ck", batchEntries="100", testFailAfterEntries="300")
        with c.client() as cl:
            w = SessionWriter(cl)
            for k in range(3):  # three newer sessions: the sink's is the least recently appending
                w.append_batch([b"other-%d" % k], w.open_session(), 1)
        _run(spark, df(), c.peers, tmp_path / "ck", batchEntries="100")
        got = [b for b in _log_bodies(c) if b.startswith(b"e-")]
        assert got == [r.encode() for r in rows]
        state = json.loads((tmp_path / "ck" / "dledger-sink" / "batch-0.json").read_text())
        assert state["done"] is True and state["base"] == 300  # resolved, not resent whole
    finally:
        c.close()


@pytest.mark.parametrize(("schema", "opts", "message"), [
    ("body string", {}, "checkpointLocation"),
    ("n long", {"checkpointLocation": "S"}, "the DataFrame has \\['n'\\]"),
    ("body long", {"checkpointLocation": "S"}, "must be binary or string"),
    ("body string", {"checkpointLocation": "S", "batchEntries": "0"}, "batchEntries must be in"),
    ("body string", {"checkpointLocation": "S", "startingIndex": "0"}, "unknown option"),
])
def test_bad_sink_options_fail_before_any_job(spark: SparkSession, group: Cluster, tmp_path: Path,
                                              schema: str, opts: dict[str, str], message: str) -> None:
    opts = {k: (str(tmp_path / "s") if v == "S" else v) for k, v in opts.items()}
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.json").write_text('{"body": "x", "n": 1}\n')  # one batch: Spark makes the writer for it
    before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    df = spark.readStream.schema(schema).json(str(d))
    with pytest.raises(Exception, match=message):
        q = (df.writeStream.format("dledger").option("peers", group.peers).options(**opts)
             .trigger(availableNow=True).start())
        q.awaitTermination(60)
        if q.exception() is not None:
            raise q.exception()
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == before
    with pytest.raises(Exception, match="option peers"):
        spark.createDataFrame([("x",)], "body string").write.format("dledger").mode("append").save()
