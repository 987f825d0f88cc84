"""The `dledger` source over the network (option peers) against a real 3-node group: the batch
table equals the file source on the same log, the stream survives a leader SIGKILL, a node
restart and a query restart from its checkpoint with every committed entry exactly once, a
start below the group's begin obeys failOnDataLoss, and bad options fail before any job runs.

One group serves the read-only tests (module fixture); the fault tests start their own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from cluster import Cluster, wait_for  # noqa: E402

from node.store.decoder import StoreDecoder  # noqa: E402
from tools.cli import main  # noqa: E402

pytestmark = pytest.mark.spark

N_ENTRIES = 3000
SMALL_FILES = {"data_file_size": 32 << 20, "index_file_size": 4 << 20}  # as make_cluster
RETAIN_NOW = {"file_reserved_hours": 0, "disk_space_ratio_to_clean": 0.0001,
              "data_file_size": 1 << 20, "index_file_size": 1 << 20, "max_body_size": 64 << 10}


def body(i: int) -> bytes:
    return b'{"order": %d, "sku": %d}' % (i, i % 17) + b"x" * (i % 50)


def _start(tmp: Path, **opts: object) -> Cluster:
    c = Cluster(tmp, 3, **{**SMALL_FILES, **opts})
    c.start()
    return c


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = _start(tmp_path_factory.mktemp("netgroup"))
    try:
        c.wait_leader(30)
        with c.client() as cl:
            for k in range(0, N_ENTRIES, 500):
                cl.append_batch([body(i) for i in range(k, k + 500)])
        c.wait_converged(30)
        # The file source reads up to each node's checkpointed committed index, which a node
        # writes every checkpoint_interval_ms: wait for it, or the comparison races the flush.
        for n in c.nodes.values():
            wait_for(lambda n=n: _checkpointed(n.store_dir) >= N_ENTRIES, 30,
                     f"{n.id}'s checkpoint to cover the appends")
        yield c
    finally:
        c.close()


def _checkpointed(store_dir: Path) -> int:
    """The committed index a node's checkpoint file names (what the file source reads up to)."""
    with StoreDecoder(str(store_dir)) as r:
        return r.committed_index


def _normal_bodies(spark: SparkSession, df) -> list[bytes]:  # noqa: ANN001
    return [bytes(r["body"]) for r in df.where("type = 'NORMAL'").orderBy("index").select("body").collect()]


def _jobs(spark: SparkSession) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


# ---------------------------------------------------------------------------- batch read
def test_network_read_equals_file_read(spark: SparkSession, group: Cluster) -> None:
    net = (spark.read.format("dledger").option("peers", group.peers)
           .option("partitionEntries", "700").load())
    rows = net.collect()
    assert len(rows) == N_ENTRIES + 1  # the leader's NOOP at 0
    served_by = {r["node"] for r in rows}
    assert served_by <= set(group.nodes)
    node = next(iter(served_by)) if len(served_by) == 1 else "n0"
    files = (spark.read.format("dledger").option("path", str(group.nodes[node].store_dir))
             .option("toIndex", str(N_ENTRIES)).load())
    cols = ["index", "term", "size", "type", "body"]
    assert sorted(tuple(r) for r in net.select(*cols).collect()) == \
        sorted(tuple(r) for r in files.select(*cols).collect())
    if len(served_by) == 1:  # pos is the serving member's own file offset
        assert sorted(tuple(r) for r in net.select("index", "pos").collect()) == \
            sorted(tuple(r) for r in files.select("index", "pos").collect())
    part = (spark.read.format("dledger").option("peers", group.peers)
            .option("fromIndex", "10").option("toIndex", "19").load())
    assert [r["index"] for r in part.orderBy("index").collect()] == list(range(10, 20))


def test_export_over_the_network(spark: SparkSession, group: Cluster, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "log.parquet")
    assert main(["export", "--peers", group.peers, "--out", out, "--from", "1",
                 "--to", "100"]) == 0
    assert capsys.readouterr().out.strip() == f"100 rows written to {out}"
    assert [bytes(r["body"]) for r in spark.read.parquet(out).orderBy("index").collect()] == \
        [body(i) for i in range(100)]
    assert main(["export", "--peers", "bad", "--out", str(tmp_path / "o")]) == 2
    assert "--peers" in capsys.readouterr().err
    dead = group.peers.split(";")[0].rsplit(":", 1)[0] + ":1"  # nothing listens on port 1
    assert main(["export", "--peers", dead, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no member of the group answered" in err[0], err


def test_fetch_blob_reads_raw_committed_entries_from_any_member(group: Cluster) -> None:
    """`netclient.fetch_blob`: consecutive committed entries in store format from the member
    named (a follower too), empty past the committed end; and the committed range."""
    from tools.pipeline.net_arrow import blob_to_batch
    from tools.pipeline.netclient import fetch_blob, group_range

    with group.client(sessions=False) as cl:
        rng = group_range(cl)
        assert rng.begin == 0 and rng.committed >= N_ENTRIES and rng.leader in group.nodes
        follower = next(n for n in group.nodes if n != rng.leader)
        blob, node = fetch_blob(cl, 1, 10, read_from=follower)
        assert node == follower
        batch, last = blob_to_batch(blob, 1, node, True)
        assert last == 10 and batch.column("body").to_pylist() == [body(i) for i in range(10)]
        assert fetch_blob(cl, rng.committed + 1000, 10) == (b"", rng.leader)


# ---------------------------------------------------------------------------- bad options
@pytest.mark.parametrize(("opts", "message"), [
    ({}, "option peers"),
    ({"peers": "P", "path": "/tmp"}, "exclude each other"),
    ({"peers": "P", "colour": "red"}, "unknown option(s) for the dledger read (peers): colour"),
    ({"peers": "P", "startingIndex": "first"}, "expected earliest, latest or an index"),
    ({"peers": "P", "startingIndex": "-3"}, "startingIndex must be >= 0"),
    ({"peers": "P", "maxEntriesPerTrigger": "many"}, "maxEntriesPerTrigger: expected an integer"),
    ({"peers": "P", "maxEntriesPerTrigger": "0"}, "maxEntriesPerTrigger must be >= 1"),
    ({"peers": "P", "includeNoop": "perhaps"}, "includeNoop: expected true/false"),
    ({"peers": "P", "timeout": "soon"}, "option timeout"),
    ({"peers": "nohostport"}, "option peers"),
])
def test_bad_stream_options_fail_before_any_job(spark: SparkSession, group: Cluster,
                                                opts: dict[str, str], message: str) -> None:
    opts = {k: (group.peers if v == "P" else v) for k, v in opts.items()}
    before = _jobs(spark)
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        spark.readStream.format("dledger").options(**opts).load()
    assert _jobs(spark) == before


@pytest.mark.parametrize(("opts", "message"), [
    ({"peers": "P", "fromIndex": "-1"}, "fromIndex must be >= 0"),
    ({"peers": "P", "toIndex": "end"}, "toIndex: expected an integer"),
    ({"peers": "P", "startingIndex": "0"}, "unknown option(s) for the dledger batch read"),
    ({"peers": "P", "partitionEntries": "0"}, "partitionEntries must be >= 1"),
])
def test_bad_read_options_fail_before_any_job(spark: SparkSession, group: Cluster,
                                              opts: dict[str, str], message: str) -> None:
    opts = {k: (group.peers if v == "P" else v) for k, v in opts.items()}
    before = _jobs(spark)
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        spark.read.format("dledger").options(**opts).load().collect()
    assert _jobs(spark) == before


# ---------------------------------------------------------------------------- streaming
def _available_now(spark: SparkSession, peers: str, out: Path, ck: Path, **opts: str) -> None:
    """Run one availableNow query (all committed when it starts) into Parquet at `out`."""
    q = (spark.readStream.format("dledger").option("peers", peers).options(**opts).load()
         .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert not q.isActive
    if q.exception() is not None:
        raise q.exception()


def test_stream_through_leader_kill_and_restarts_is_exactly_once(spark: SparkSession, tmp_path: Path) -> None:
    c = _start(tmp_path / "c")
    out, ck = tmp_path / "out", tmp_path / "ck"
    try:
        c.wait_leader(30)
        q = (spark.readStream.format("dledger").option("peers", c.peers)
             .option("startingIndex", "earliest").option("maxEntriesPerTrigger", "400").load()
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(ck)).trigger(processingTime="100 milliseconds").start())
        try:
            killed = None
            with c.client(timeout=30.0) as cl:  # session appends: each body stored once
                for k in range(0, 3000, 200):
                    cl.append_batch([body(i) for i in range(k, k + 200)])
                    if k == 800:  # mid-stream, with batches in flight
                        wait_for(lambda: q.lastProgress is not None, 60, "a first micro-batch")
                        killed = c.nodes[c.wait_leader(30)]
                        killed.kill()
                    if k == 2000:  # the killed node restarts while the query runs
                        killed.start()
            wait_for(lambda: spark.read.parquet(str(out)).count() >= 3000, 120,
                     "every committed entry in the sink")
        finally:
            q.stop()
        # The query restarts from its checkpoint and goes on.
        with c.client(timeout=30.0) as cl:
            cl.append_batch([body(i) for i in range(3000, 3500)])
        _available_now(spark, c.peers, out, ck)
        got = [bytes(r["body"]) for r in spark.read.parquet(str(out)).orderBy("index").collect()]
        assert got == [body(i) for i in range(3500)]  # in log order, none twice, none missing
    finally:
        c.close()


def test_start_below_the_begin_follows_fail_on_data_loss(spark: SparkSession, tmp_path: Path) -> None:
    c = _start(tmp_path / "c", **RETAIN_NOW)
    try:
        c.wait_leader(30)
        with c.client(timeout=30.0) as cl:
            for _ in range(40):
                cl.append_batch([bytes(1000)] * 100)  # ~4 MB: several 1 MiB data files
            cl.append(b"last")
        c.wait_converged(30)
        wait_for(lambda: all((m := c.metadata(n)) and m.ledger_begin_index > 0 for n in c.nodes),
                 30, "every member deletes its oldest files")
        with pytest.raises(Exception, match="failOnDataLoss=false"):
            _available_now(spark, c.peers, tmp_path / "o1", tmp_path / "k1", startingIndex="0")
        _available_now(spark, c.peers, tmp_path / "o2", tmp_path / "k2", startingIndex="0",
                       failOnDataLoss="false", includeNoop="true")
        begin = max(c.metadata(n).ledger_begin_index for n in c.nodes)
        end = c.metadata(c.wait_leader()).committed_index
        idx = [r["index"] for r in spark.read.parquet(str(tmp_path / "o2")).orderBy("index").collect()]
        assert idx[0] <= begin and idx == list(range(idx[0], end + 1)) and idx[0] > 0
    finally:
        c.close()


def test_index_start_and_latest_start(spark: SparkSession, group: Cluster, tmp_path: Path) -> None:
    _available_now(spark, group.peers, tmp_path / "a", tmp_path / "ka", startingIndex="2990")
    assert sorted(r["index"] for r in spark.read.parquet(str(tmp_path / "a")).collect()) == \
        list(range(2990, N_ENTRIES + 1))
    # latest (the default): only what commits after the query started
    q = (spark.readStream.format("dledger").option("peers", group.peers).load()
         .writeStream.format("memory").queryName("latest_start")
         .trigger(processingTime="50 milliseconds").start())
    try:
        wait_for(lambda: q.lastProgress is not None, 60, "the query's first trigger")
        with group.client() as cl:
            first = cl.append_batch([b"new-%d" % i for i in range(5)])[0].index
        wait_for(lambda: spark.table("latest_start").count() >= 5, 60, "the new entries")
        rows = spark.table("latest_start").orderBy("index").collect()
        assert [(r["index"], bytes(r["body"])) for r in rows] == \
            [(first + i, b"new-%d" % i) for i in range(5)]
    finally:
        q.stop()


def test_a_secure_group_is_read_with_the_key_file_option(spark: SparkSession, tmp_path: Path) -> None:
    """A group with CurveZMQ keys: option keyFile (a client secret key with the members' public
    keys beside it) reaches the executors' clients; a key file that cannot be used is an option
    error at load(), before any job."""
    from ipc.security import local_group_keys

    keys = tmp_path / "keys"
    key_file = local_group_keys(keys, ["n0", "n1", "n2"])
    c = Cluster(tmp_path / "g", 3, keys_dir=keys, **SMALL_FILES)
    c.key_file = key_file
    c.start()
    try:
        c.wait_leader(30)
        with c.client() as cl:
            cl.append_batch([body(i) for i in range(200)])
        c.wait_converged(30)
        df = spark.read.format("dledger").option("peers", c.peers).option("keyFile", str(key_file)).load()
        assert _normal_bodies(spark, df) == [body(i) for i in range(200)]
        jobs = _jobs(spark)
        with pytest.raises(Exception, match="keyFile"):
            spark.read.format("dledger").option("peers", c.peers).option("keyFile", str(tmp_path / "none")).load()
        assert _jobs(spark) == jobs
    finally:
        c.close()
