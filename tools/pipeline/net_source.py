"""The `dledger` source over the network (option `peers`): committed entries read from the
group's members by Spark executors, as a batch table. The stream (stream_source.py) and the
sink (sink.py) share the option parsing and the partition reader defined here.

    spark.read.format("dledger").option("peers", PEERS).load()

Schema: ``node string, index long, term long, pos long, size int, type string, body binary``:
`node` is the member that served the entry, `pos` its byte offset in THAT member's data files
(followers re-stamp it), `size` the stored entry's size (48-byte header + body) — the same
values as the file source's columns of those names. The file source's `body_crc`, `crc_ok`
and `error` are left out: every entry a member serves has had its CRC checked, and a damaged
one is never served. No timestamp column: an entry records no time.

Why driver-planned fixed ranges: the committed prefix of a log never changes, so a range
[a, b] planned on the driver reads the same entries on any member, on any attempt of a task —
a retried task returns the same rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC
from ipc.entry_codec import HEADER_SIZE
from ipc.sockets import PeersError, parse_peers
from tools.pipeline.datasource import SCHEMA, OptionError, _bool, _int, normalize_options
from tools.pipeline.netclient import fetch_blob, group_range

log = logging.getLogger("dledger.pipeline")

NET_SCHEMA = StructType([f for f in SCHEMA.fields if f.name not in ("body_crc", "crc_ok", "error")])
"""The file source's columns less what only a forensic read of files has: the network never
serves a damaged entry, so there is no CRC verdict or decode error to report."""

DEFAULT_TIMEOUT = 10.0
DEFAULT_PARTITION_ENTRIES = 65536
FETCH_ENTRIES = 4096  # entries asked per fetch: ~4 MiB of 1 KiB entries, a node's answer cap

_COMMON = frozenset({"peers", "group", "timeout", "keyfile"})
BATCH_OPTIONS = _COMMON | {"fromindex", "toindex", "includenoop", "partitionentries"}
STREAM_OPTIONS = _COMMON | {"startingindex", "maxentriespertrigger", "includenoop",
                            "failondataloss", "partitionentries"}
SINK_OPTIONS = _COMMON | {"bodycolumn", "sinkstatedir", "checkpointlocation", "batchentries",
                          "testfailafterentries"}


class DataLossError(RuntimeError):
    """Entries the query must read are gone (retention moved the group's begin past them)."""


def check_mode(options: Mapping[str, str]) -> str:
    """"files" or "network": exactly one of `path`/`paths` and `peers` must be given."""
    o = normalize_options(options)
    files = bool((o.get("path") or "").strip() or (o.get("paths") or "").strip())
    net = bool((o.get("peers") or "").strip())
    if files and net:
        raise OptionError("options path/paths (store files) and peers (the network) exclude each "
                          "other: give one")
    if not files and not net:
        raise OptionError("option peers (the group's members, id-host:port;...) or path/paths "
                          "(store directories) is required")
    return "network" if net else "files"


class NetOptions:
    """Options common to the network modes, checked on the driver before any job starts."""

    def __init__(self, options: Mapping[str, str], allowed: frozenset[str], what: str) -> None:
        o = self.raw = normalize_options(options)
        unknown = sorted(k for k in o if k not in allowed)
        if unknown:
            raise OptionError(f"unknown option(s) for the dledger {what}: {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(allowed))})")
        self.peers = (o.get("peers") or "").strip()
        if not self.peers:
            raise OptionError("option peers is required: the group's members, id-host:port;...")
        try:
            self.members = list(parse_peers(self.peers))
        except (PeersError, ValueError) as e:
            raise OptionError(f"option peers: {e}") from None
        if not self.members:
            raise OptionError("option peers names no member")
        self.group = (o.get("group") or "default").strip()
        t = o.get("timeout")
        try:
            self.timeout = DEFAULT_TIMEOUT if t is None else float(t)
        except ValueError:
            raise OptionError(f"option timeout: expected seconds, got {t!r}") from None
        if not self.timeout > 0:
            raise OptionError("option timeout must be > 0")
        pe = _int(o, "partitionEntries")
        if pe is not None and pe < 1:
            raise OptionError("option partitionEntries must be >= 1")
        self.partition_entries = pe or DEFAULT_PARTITION_ENTRIES
        self.key_file = key_file_option(o)

    def client(self) -> DLedgerClient:
        try:
            return DLedgerClient(self.peers, group=self.group, timeout=self.timeout, sessions=False,
                                 key_file=self.key_file)
        except Exception as e:  # a bad group name is a ProtocolError: say it as an option error
            raise OptionError(f"option group {self.group!r}: {e}") from None

    def index(self, key: str) -> int | None:
        v = _int(self.raw, key)
        if v is not None and v < 0:
            raise OptionError(f"option {key} must be >= 0")
        return v


def key_file_option(o: Mapping[str, str]) -> str | None:
    """Option keyFile (default: $DLEDGER_KEY_FILE on the driver): the client secret key for a
    secure group, checked here so that a bad file is an option error before any job; the path
    travels to the executors, which must see the same file (a shared path on a cluster)."""
    from ipc.security import KeyFileError, client_key_file

    try:
        return client_key_file(o.get("keyfile"), "option keyFile")
    except KeyFileError as e:
        raise OptionError(str(e)) from None


def check_read_options(options: Mapping[str, str]) -> None:
    """Every option of a network read (batch or stream), checked when Spark asks for the schema
    — at `load()`, before any job; Spark creates a stream's reader only at `start()`. Which
    options fit which kind of read is checked again when its reader is made."""
    from tools.pipeline.stream_source import parse_starting_index

    opts = NetOptions(options, BATCH_OPTIONS | STREAM_OPTIONS, "read (peers)")
    for key in ("fromIndex", "toIndex"):
        opts.index(key)
    m = _int(opts.raw, "maxEntriesPerTrigger")
    if m is not None and m < 1:
        raise OptionError("option maxEntriesPerTrigger must be >= 1")
    for key in ("includeNoop", "failOnDataLoss"):
        _bool(opts.raw, key, True)
    parse_starting_index(opts.raw.get("startingIndex"))


class NetPartition(InputPartition):
    """Committed entries [from_index, to_index] of a group, read preferably from `read_from`.
    Pickled to executors: plain values only."""

    def __init__(self, peers: str, group: str, timeout: float, from_index: int, to_index: int,
                 read_from: str | None, include_noop: bool, fail_on_data_loss: bool = True,
                 key_file: str | None = None) -> None:
        super().__init__((from_index, to_index))
        self.peers, self.group, self.timeout, self.key_file = peers, group, timeout, key_file
        self.from_index, self.to_index, self.read_from = from_index, to_index, read_from
        self.include_noop, self.fail_on_data_loss = include_noop, fail_on_data_loss

    def __repr__(self) -> str:
        return f"NetPartition([{self.from_index}, {self.to_index}] from {self.read_from})"


def split_range(opts: NetOptions, lo: int, hi: int, include_noop: bool,
                fail_on_data_loss: bool = True) -> list[NetPartition]:
    """[lo, hi] in at most `partitionEntries`-wide pieces, spread over the members in turn."""
    if hi < lo:
        return []
    n = hi - lo + 1
    k = max(1, math.ceil(n / opts.partition_entries))
    width = math.ceil(n / k)
    parts = []
    for j in range(k):
        a = lo + j * width
        b = min(hi, a + width - 1)
        parts.append(NetPartition(opts.peers, opts.group, opts.timeout, a, b,
                                  opts.members[j % len(opts.members)], include_noop, fail_on_data_loss,
                                  opts.key_file))
    return parts


def read_partition(p: NetPartition) -> Iterator:
    """The partition's entries as Arrow record batches (one per answer), in index order.

    Reads from `read_from` first; any failure there (the member died, lags, restarts) moves
    the rest of the range to whichever member the client picks. Entries below the group's
    begin raise DataLossError, or with failOnDataLoss=false are skipped with a warning.

    Each answer is one FETCH's raw entries (any member), checked as arrays (net_arrow.py)."""
    from tools.pipeline.net_arrow import blob_to_batch

    client = DLedgerClient(p.peers, group=p.group, timeout=p.timeout, sessions=False,
                           key_file=getattr(p, "key_file", None))
    prefer = p.read_from
    try:
        i = p.from_index
        while i <= p.to_index:
            want = p.to_index - i + 1
            try:
                blob, node = fetch_blob(client, i, min(FETCH_ENTRIES, want), prefer, p.timeout)
                batch, last = blob_to_batch(blob, i, node, p.include_noop)
            except DLedgerError as e:
                if e.code == RC.INDEX_LESS_THAN_LOCAL_BEGIN:
                    begin = group_range(client).begin
                    if p.fail_on_data_loss:
                        raise DataLossError(
                            f"entries [{i}, {min(begin, p.to_index + 1) - 1}] of group {p.group} are no "
                            f"longer held by any member (its log now begins at {begin}); set "
                            "failOnDataLoss=false to skip them") from None
                    log.warning("dledger: entries [%d, %d] of group %s are gone (begin %d): skipped",
                                i, min(begin, p.to_index + 1) - 1, p.group, begin)
                    i = max(i + 1, begin)
                    continue
                if prefer is not None:
                    prefer = None  # any member from here on
                    continue
                raise
            if last < i:
                if prefer is not None:
                    prefer = None  # that member has not committed them yet: any member
                    continue
                raise DLedgerError(RC.INDEX_OUT_OF_RANGE, f"entry {i} of group {p.group} was planned "
                                   "as committed but no member serves it")
            if batch is not None:
                yield batch
            i = last + 1
    finally:
        client.close()


def _to_batch(pa, node: str, es: list) -> object:  # noqa: ANN001 - pyarrow module, lazily imported
    bodies = [e.body for e in es]
    n = len(es)
    return pa.RecordBatch.from_arrays([
        pa.array([node] * n, pa.string()),
        pa.array([e.index for e in es], pa.int64()),
        pa.array([e.term for e in es], pa.int64()),
        pa.array([e.pos for e in es], pa.int64()),
        pa.array([HEADER_SIZE + len(b) for b in bodies], pa.int32()),
        pa.array([e.type for e in es], pa.string()),
        pa.array(bodies, pa.binary()),
    ], names=["node", "index", "term", "pos", "size", "type", "body"])


class NetBatchReader(DataSourceReader):
    """`spark.read.format("dledger").option("peers", ...)`: the committed log, or
    [fromIndex, toIndex] of it, as fixed ranges read by the executors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = NetOptions(options, BATCH_OPTIONS, "batch read (peers)")
        self.from_index = self.opts.index("fromIndex")
        self.to_index = self.opts.index("toIndex")
        self.include_noop = _bool(self.opts.raw, "includeNoop", True)

    def partitions(self) -> list[InputPartition]:
        client = self.opts.client()
        try:
            rng = group_range(client)
        finally:
            client.close()
        lo = rng.begin if self.from_index is None else self.from_index
        if lo < rng.begin:
            raise DataLossError(f"fromIndex {lo} is below the group's begin {rng.begin}")
        hi = rng.committed if self.to_index is None else min(self.to_index, rng.committed)
        return list(split_range(self.opts, lo, hi, self.include_noop))

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, NetPartition):
            return  # Spark's placeholder partition for an empty plan
        yield from read_partition(partition)
