"""The `dledger` streaming source: a group's committed entries as an unbounded table.

    spark.readStream.format("dledger").option("peers", PEERS).option("group", G) \\
         .option("startingIndex", "earliest").load()

Offsets are log indexes: ``{"index": N}`` is the next index to read. A micro-batch is the range
[start, end) of committed entries, fixed on the driver when Spark plans it and written to the
query's offset log; the committed prefix never changes, so re-running a batch (after a failed
task, or a query restarted from its checkpoint) reads exactly the same entries. That, with a
sink that is idempotent per batch, is exactly-once end to end.

Why the committed end comes from METADATA and not from the leader alone: during a failover
there is no leader for a moment, and any member's committed index is committed for the group,
so the highest one any live member reports is safe (`netclient.group_range`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ipc.client import DLedgerClient
from tools.pipeline.datasource import OptionError, _bool, _int
from tools.pipeline.net_source import (
    STREAM_OPTIONS,
    DataLossError,
    NetOptions,
    NetPartition,
    read_partition,
    split_range,
)
from tools.pipeline.netclient import GroupRange, group_range

log = logging.getLogger("dledger.pipeline")


def parse_starting_index(value: str | None) -> str | int:
    """`earliest`, `latest` (the default, like Kafka's startingOffsets) or an index >= 0."""
    v = (value or "latest").strip().lower()
    if v in ("earliest", "latest"):
        return v
    try:
        n = int(v)
    except ValueError:
        raise OptionError(f"option startingIndex: expected earliest, latest or an index, got {value!r}") from None
    if n < 0:
        raise OptionError("option startingIndex must be >= 0")
    return n


class DLedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets, admission control and planning. Executors read the partitions."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = NetOptions(options, STREAM_OPTIONS, "stream (readStream)")
        self.starting = parse_starting_index(self.opts.raw.get("startingIndex"))
        self.max_per_trigger = _int(self.opts.raw, "maxEntriesPerTrigger")
        if self.max_per_trigger is not None and self.max_per_trigger < 1:
            raise OptionError("option maxEntriesPerTrigger must be >= 1")
        self.include_noop = _bool(self.opts.raw, "includeNoop", False)
        self.fail_on_data_loss = _bool(self.opts.raw, "failOnDataLoss", True)
        self._client: DLedgerClient | None = None
        self._available_now: int | None = None  # Trigger.AvailableNow: the end fixed at start

    # ------------------------------------------------------------------ group state
    def _range(self) -> GroupRange:
        if self._client is None:  # created in the driver's Python process that uses it
            self._client = self.opts.client()
        return group_range(self._client)

    def _checked_start(self, start: int, rng: GroupRange) -> int:
        """`start`, or the group's begin when retention moved past it and failOnDataLoss=false."""
        if start >= rng.begin:
            return start
        if self.fail_on_data_loss:
            raise DataLossError(
                f"the query must read from index {start}, but group {self.opts.group} now begins at "
                f"{rng.begin} (entries [{start}, {rng.begin - 1}] were removed by retention); "
                "restart with failOnDataLoss=false to skip them, or a new checkpoint")
        log.warning("dledger: entries [%d, %d] of group %s are gone: the query skips to %d",
                    start, rng.begin - 1, self.opts.group, rng.begin)
        return rng.begin

    # ------------------------------------------------------------------ offsets
    def initialOffset(self) -> dict:
        rng = self._range()
        if self.starting == "earliest":
            n = rng.begin
        elif self.starting == "latest":
            n = rng.committed + 1
        else:
            n = self._checked_start(int(self.starting), rng)
        return {"index": int(n)}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger is not None:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._range().committed + 1

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        rng = self._range()
        s = self._checked_start(int(start["index"]), rng)
        end = rng.committed + 1
        if self._available_now is not None:
            end = min(end, self._available_now)
        if isinstance(limit, ReadMaxRows):
            end = min(end, s + max(1, int(limit.max_rows)))
        return {"index": int(max(end, int(start["index"])))}

    def reportLatestOffset(self) -> dict | None:
        try:
            return {"index": int(self._range().committed + 1)}
        except Exception:  # noqa: BLE001 - only a progress report: never fail the query for it
            return None

    # ------------------------------------------------------------------ planning and reading
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        s, e = int(start["index"]), int(end["index"])
        if e <= s:
            return []
        # A begin that moved past `s` since latestOffset is caught by the executors: the same
        # failOnDataLoss rule applies there (read_partition).
        return list(split_range(self.opts, s, e - 1, self.include_noop, self.fail_on_data_loss))

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, NetPartition):
            return
        yield from read_partition(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the log is not consumed by reading it."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
