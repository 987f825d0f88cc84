"""The `dledger` sink: one log entry per row, appended exactly once per micro-batch.

    df.write.format("dledger").option("peers", PEERS).save()
    df.writeStream.format("dledger").option("peers", PEERS) \\
        .option("checkpointLocation", CK).start()

The design, and why (docs/pipeline.md "Writing to a group" states the guarantee):

* Tasks only COLLECT their rows' bodies and return them in their commit message; they write
  nothing. A failed or speculative task attempt therefore stores nothing, whatever it had read.
* The DRIVER's `commit(messages, batchId)` appends the batch under a client session it opened
  for that batch, after durably recording (batchId, session, count, digest) in a state file
  under `sinkStateDir` (default: `<checkpointLocation>/dledger-sink`). Bodies are stamped
  seq 1..n in partition order and sent in chunks, each after the previous one returned.
* When it has appended everything it records the batch as done. A batch already done is
  skipped (Spark re-runs the last batch when the driver died after our commit but before its
  own commit log entry).
* A batch that was started but not recorded done (the driver died mid-commit) is resent
  under the SAME session and seqs, cut at the same places: the leader answers every stamp it
  already holds with the original index and writes nothing, and stores the rest once. The
  re-run must produce the same bodies in the same order (checked against the recorded count
  and digest; a non-deterministic query fails loudly rather than risk a mixed batch).
* If the leader no longer knows the session (SESSION_EXPIRED: evicted, or opened by an
  earlier leader and never written to), the log says what it wrote: once the group has a
  leader whose whole log is committed, the committed entries stamped with that session since
  the index recorded when it was opened are all it will ever hold. They must be the batch's
  next bodies (seqs 1..m); the rest goes under a new session, recorded first. Anything else
  (SESSION_SEQ_TOO_OLD, a log that disagrees) fails the query: never a guess, never a
  duplicate.

The cost: every row travels to the driver, and one driver thread appends. For a batch write
(`df.write`) there is no batch id: a retried task is still harmless (tasks write nothing), the
appends of one save() are deduplicated within it, but a driver that dies mid-save leaves a
prefix written, and running the save again appends it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from ipc import protocol as P
from ipc.client import DLedgerClient, DLedgerError
from ipc.client.writer import SessionWriter
from ipc.entry_codec import HEADER_SIZE
from tools.pipeline.datasource import OptionError, _int
from tools.pipeline.net_source import SINK_OPTIONS, NetOptions
from tools.pipeline.netclient import GroupRange, fetch_blob, group_range

log = logging.getLogger("dledger.pipeline")

DEFAULT_BATCH_ENTRIES = 4096
MAX_CHUNK_BYTES = 16 << 20  # one BATCH_APPEND frame: well under the 64 MiB frame limit
KEEP_STATES = 16  # state files of older batches are removed past this many


class SinkError(RuntimeError):
    """The sink cannot append a batch exactly once: the query must stop and say why."""


@dataclass
class BodiesMessage(WriterCommitMessage):
    """A task's rows, collected for the driver to append (see the module docstring)."""

    partition: int
    bodies: list[bytes]


class SinkOptions:
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.net = NetOptions(options, SINK_OPTIONS, "sink (write/writeStream)")
        raw = self.net.raw
        self.body_column = (raw.get("bodyColumn") or "body").strip()
        fields = {f.name: f for f in schema.fields}
        if self.body_column not in fields:
            raise OptionError(f"the sink appends column {self.body_column!r} as each entry's body, "
                              f"but the DataFrame has {sorted(fields)}: rename a column to body or "
                              "set option bodyColumn")
        dt = fields[self.body_column].dataType
        if not isinstance(dt, BinaryType | StringType):
            raise OptionError(f"column {self.body_column!r} is {dt.simpleString()}: the body must be "
                              "binary or string (e.g. to_json(struct(...)))")
        self.column_index = schema.fieldNames().index(self.body_column)
        be = _int(raw, "batchEntries")
        self.batch_entries = DEFAULT_BATCH_ENTRIES if be is None else be
        if not 1 <= self.batch_entries <= P.MAX_BATCH_COUNT:
            raise OptionError(f"option batchEntries must be in [1, {P.MAX_BATCH_COUNT}]")
        state = (raw.get("sinkStateDir") or "").strip()
        ck = (raw.get("checkpointLocation") or "").strip()
        self.state_dir = state or (os.path.join(ck, "dledger-sink") if ck else "")
        self.fail_after = _int(raw, "testFailAfterEntries")  # fault injection for the tests


def collect(iterator: Iterator, column: int, partition: int) -> BodiesMessage:
    """Executor side: the bodies of this task's rows (null bodies are refused)."""
    out: list[bytes] = []
    for row in iterator:
        b = row[column]
        if b is None:
            raise SinkError(f"a row has a null {column}th column: every entry needs a body")
        out.append(b.encode() if isinstance(b, str) else bytes(b))
    return BodiesMessage(partition, out)


def _partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def _bodies(messages: list) -> list[bytes]:
    msgs = sorted((m for m in messages if isinstance(m, BodiesMessage)), key=lambda m: m.partition)
    return [b for m in msgs for b in m.bodies]


def _digest(bodies: list[bytes]) -> str:
    h = hashlib.sha256()
    for b in bodies:
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()


def _chunks(bodies: list[bytes], max_entries: int) -> Iterator[tuple[int, list[bytes]]]:
    """(offset, bodies) pieces of at most `max_entries` bodies and MAX_CHUNK_BYTES."""
    i = 0
    while i < len(bodies):
        j, size = i, 0
        while j < len(bodies) and j - i < max_entries and (j == i or size + len(bodies[j]) <= MAX_CHUNK_BYTES):
            size += len(bodies[j])
            j += 1
        yield i, bodies[i:j]
        i = j


class BatchState:
    """One state file per batch: `<dir>/batch-<id>.json`, written atomically (tmp, fsync,
    rename, fsync of the directory) so a crash leaves the old or the new content, never half."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)

    def path(self, batch_id: int) -> Path:
        return self.dir / f"batch-{batch_id}.json"

    def load(self, batch_id: int) -> dict | None:
        p = self.path(batch_id)
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise SinkError(f"sink state {p} is unreadable ({e}): cannot tell what batch {batch_id} "
                            "already wrote") from None

    def save(self, batch_id: int, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        p = self.path(batch_id)
        tmp = p.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def prune(self, batch_id: int) -> None:
        for p in self.dir.glob("batch-*.json"):
            try:
                n = int(p.stem.split("-", 1)[1])
            except ValueError:
                continue
            if n <= batch_id - KEEP_STATES:
                p.unlink(missing_ok=True)


def settled_range(client: DLedgerClient, timeout: float) -> GroupRange:
    """The group's range once its leader's whole log is committed (its NOOP of this term
    included): from then on no member holding entries the leader lacks can ever lead, so the
    committed log is everything that will ever be in it up to there."""
    deadline = time.monotonic() + timeout
    while True:
        m = client.metadata()
        lead = m.node(m.leader_id) if m.leader_id else None
        if lead is not None and lead.alive and lead.committed_index is not None \
                and lead.committed_index == lead.ledger_end_index:
            return group_range(client)
        if time.monotonic() >= deadline:
            raise SinkError("the group did not settle (a leader with its whole log committed) in time "
                            "to check what a forgotten session wrote")
        time.sleep(0.05)  # polling the group's state, bounded by the deadline


def stored_under(client: DLedgerClient, session: int, from_index: int, to_index: int) -> list[bytes]:
    """Bodies of the committed entries in [from_index, to_index] stamped with `session`, in seq
    order; raises SinkError unless their seqs are exactly 1..m (a leader stores a seq only after
    the one before it, so anything else means the log is not what this sink wrote)."""
    import numpy as np

    from tools.pipeline.net_arrow import _HEADER_DT, _SPAN, offsets_of

    found: list[tuple[int, bytes]] = []
    i = from_index
    while i <= to_index:
        blob, _node = fetch_blob(client, i, min(4096, to_index - i + 1))
        if not blob:
            raise SinkError(f"entries from {i} are committed but were not served")
        offs = offsets_of(blob)
        h = np.frombuffer(blob, dtype=np.uint8)[(offs[:, None] + _SPAN).ravel()].view(_HEADER_DT)
        for k in np.flatnonzero(h["channel"] == session).tolist():
            off, size = int(offs[k]), int(h["size"][k])
            found.append((int(h["chain_crc"][k]), blob[off + HEADER_SIZE:off + size]))
        i += len(offs)
    seqs = [q for q, _b in found]
    if seqs != list(range(1, len(seqs) + 1)):
        raise SinkError(f"session {session:#x} holds seqs {seqs[:5]}... in the log, not 1..m")
    return [b for _q, b in found]


def append_once(opts: SinkOptions, bodies: list[bytes], batch_id: int | None) -> int:
    """Append `bodies` under one session, exactly once per `batch_id` (see the module
    docstring); returns how many entries the batch holds. Driver side."""
    if not bodies:
        return 0
    state = BatchState(opts.state_dir) if batch_id is not None else None
    digest = _digest(bodies)
    # A resend must cut the batch where the first run did: a BATCH_APPEND is stored whole or
    # not at all, so each resent chunk is then wholly known to the leader or wholly new (one
    # straddling a stored prefix would be refused as SESSION_SEQ_INVALID).
    chunk_entries = opts.batch_entries
    client = opts.net.client()
    try:
        writer = SessionWriter(client)
        prior = state.load(batch_id) if state else None
        if prior is not None and prior.get("done"):
            log.info("dledger sink: batch %d was appended already", batch_id)
            return int(prior["count"])
        if prior is not None:
            if prior.get("count") != len(bodies) or prior.get("digest") != digest:
                raise SinkError(
                    f"batch {batch_id} is re-run with different rows ({len(bodies)} now, "
                    f"{prior.get('count')} when it was started): part of it may be in the log "
                    "already, so it is not written again. The query must be deterministic per batch.")
            cur = {**prior, "base": int(prior.get("base", 0))}
            chunk_entries = int(prior.get("chunk", chunk_entries))
            log.warning("dledger sink: batch %d resent under its session %#x", batch_id, cur["session"])
        else:
            cur = _new_segment(client, writer, 0)
            cur.update(batch=batch_id, count=len(bodies), digest=digest, chunk=chunk_entries, done=False)
            if state:
                state.save(batch_id, cur)
        while True:
            try:
                _send(opts, writer, bodies, cur, chunk_entries, batch_id)
                break
            except _Forgotten as e:
                cur = _resolve(client, writer, bodies, cur, opts.net.timeout, batch_id, e.error)
                if state:
                    state.save(batch_id, cur)
        if state:
            state.save(batch_id, {**cur, "done": True})
            state.prune(batch_id)
        return len(bodies)
    finally:
        client.close()


class _Forgotten(Exception):
    def __init__(self, error: DLedgerError) -> None:
        super().__init__(str(error))
        self.error = error


def _new_segment(client: DLedgerClient, writer: SessionWriter, base: int) -> dict:
    """A fresh session for bodies[base:], and the index its entries cannot come before (the
    committed end before it was opened, + 1): where a scan for them starts."""
    start = group_range(client).committed + 1
    return {"session": writer.open_session(), "base": base, "from_index": start}


def _send(opts: SinkOptions, writer: SessionWriter, bodies: list[bytes], cur: dict,
          chunk_entries: int, batch_id: int | None) -> None:
    """bodies[base:] under cur's session, seqs from 1, cut every `chunk_entries`."""
    base, session = int(cur["base"]), int(cur["session"])
    sent = base
    for off, chunk in _chunks(bodies[base:], chunk_entries):
        try:
            writer.append_batch(chunk, session, off + 1)
        except DLedgerError as e:
            if e.name == "SESSION_EXPIRED":
                raise _Forgotten(e) from e
            raise SinkError(f"batch {batch_id}: entries {base + off + 1}..{base + off + len(chunk)} of "
                            f"{len(bodies)} under session {session:#x}: {e}") from e
        sent += len(chunk)
        if opts.fail_after is not None and sent >= opts.fail_after:
            raise SinkError(f"injected failure after {sent} entries (testFailAfterEntries)")


def _resolve(client: DLedgerClient, writer: SessionWriter, bodies: list[bytes], cur: dict,
             timeout: float, batch_id: int | None, error: DLedgerError) -> dict:
    """The leader no longer knows cur's session: read from the log which of bodies[base:] it
    stored (the entries stamped with it since cur's from_index), check they are the batch's
    next bodies, and go on with the rest under a new session. No guessing: what the committed
    log holds, once settled, is all that session will ever have written."""
    if "from_index" not in cur:
        raise SinkError(f"batch {batch_id}: {error}; its state names no index to look from") from error
    rng = settled_range(client, timeout)
    base, session = int(cur["base"]), int(cur["session"])
    stored = stored_under(client, session, int(cur["from_index"]), rng.committed)
    if stored != bodies[base:base + len(stored)]:
        raise SinkError(f"batch {batch_id}: the entries of session {session:#x} in the log are not "
                        "this batch's rows: nothing more is written") from error
    log.warning("dledger sink: batch %d: session %#x forgotten by the leader after %d of its "
                "entries were stored: the rest goes under a new session", batch_id, session, len(stored))
    nxt = _new_segment(client, writer, base + len(stored))
    return {**cur, **nxt}


class DLedgerBatchWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = SinkOptions(options, schema)

    def write(self, iterator: Iterator) -> WriterCommitMessage:
        return collect(iterator, self.opts.column_index, _partition_id())

    def commit(self, messages: list) -> None:
        append_once(self.opts, _bodies(messages), None)

    def abort(self, messages: list) -> None:
        """Tasks wrote nothing: nothing to undo."""


class DLedgerStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = SinkOptions(options, schema)
        if not self.opts.state_dir:
            raise OptionError("the dledger streaming sink needs option checkpointLocation (or "
                              "sinkStateDir) to record which batches it appended")

    def write(self, iterator: Iterator) -> WriterCommitMessage:
        return collect(iterator, self.opts.column_index, _partition_id())

    def commit(self, messages: list, batchId: int) -> None:
        append_once(self.opts, _bodies(messages), int(batchId))

    def abort(self, messages: list, batchId: int) -> None:
        """Tasks wrote nothing: nothing to undo (a batch half-appended by commit is resent
        whole under its session when the query re-runs it)."""
