"""Throughput/latency benchmark of a group, with a progress bar, verified at the end.

Against --peers (a running group), or --local N (starts N nodes on loopback in a temporary
directory and stops them at the end). Each request appends --batch bodies of --size bytes;
--mode async keeps --concurrency requests in flight on one pipelined client, --mode sync runs
--concurrency threads that each wait for every answer (--concurrency 1: one append at a time).
After a --warmup, it runs for --duration seconds (or --count entries) and reports entries/s,
MB/s and latency percentiles; then reads back a sample of acknowledged indexes and compares the
bodies (a bench that does not check what it wrote is not trusted). With --local it also
reports the group's anonymous memory before, after and every 10 s (`rss_anon_mb` in --json),
and the leader before and after. Exit 1 if the error rate exceeds --max-error-rate or the
verification fails. Errors are reported by code (`errors_by_code`). Latencies go into
HdrHistograms (3 significant digits, fixed memory: an hour-long run holds no more than a
minute-long one); stderr shows each phase (start-up, putting keys, warmup, measuring,
read-back) with a bar and the time left on a terminal, one line a second otherwise.

--kv benches the replicated KV store instead (a group running `--state-machine kv`; --local
starts its group with it): puts of --size-byte values over --keys keys (b"k0000000"...,
sequential like etcd's benchmark), each an append of a KV PUT command, exactly what
`KVClient.put` sends; linearizable gets, each a `query` of a KV GET, exactly what
`KVClient.get` sends (read-index: a heartbeat round, then the leader's applier answers).
--kv-op get and mixed first put every key once (batched, not measured); --kv-op get compares
every answer with what was put, mixed (even ops put, odd ops get the key just put) that it
was found. In flight: puts are pipelined on one client (`append_async`); gets
use `query_async` where the client has one, else --concurrency threads each waiting for its
answer (one Python process: the client's I/O thread and the waiting threads share one GIL).
--mode sync always uses threads. Results as for the log, in ops (`ops_per_s`, `ops`);
`verified` reads back a sample of keys and compares value and revision with the newest
acknowledged put of each.

Examples:
  dledger bench --local 3 --size 1024 --batch 64 --concurrency 16 --duration 10
  dledger bench --local 3 --batch 1 --concurrency 256 --json
  dledger bench --peers "$P" --mode sync --concurrency 1 --plot latency.png
  dledger bench --local 3 --kv --kv-op put --concurrency 64 --duration 10
  dledger bench --local 3 --kv --kv-op get --mode sync --concurrency 1 --duration 10
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import random
import resource
import struct
import threading
import time

from hdrh.histogram import HdrHistogram

from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC
from node.statemachine import kv as K
from tools.bench.progress import BenchProgress
from tools.bench.record import Recorder, percentile_ms
from tools.cli import (
    CliError,
    fraction,
    key_file_of,
    nonneg_float,
    nonneg_int,
    peers_arg,
    positive_float,
    positive_int,
    size_arg,
)
from tools.local_group import LocalGroup

_SEQ = struct.Struct(">Q")


def add_arguments(p: argparse.ArgumentParser) -> None:
    tgt = p.add_mutually_exclusive_group(required=True)
    tgt.add_argument("--peers", type=peers_arg, metavar="PEERS",
                     help="a running group, DLedger peers string (required: --peers or --local)")
    tgt.add_argument("--local", type=positive_int, metavar="N",
                     help="start and stop an N-node local group, 64MiB/8MiB files in a temporary "
                          "directory (required: --peers or --local)")
    p.add_argument("--group", default="default", help="group name (default: %(default)s)")
    p.add_argument("--size", type=size_arg, default=1024, metavar="SIZE",
                   help="body size, bytes or 1KiB-style, at most the nodes' max-body-size (4MiB, "
                        "or a --server-arg --max-body-size) (default: %(default)s)")
    p.add_argument("--duration", type=positive_float, default=10.0, metavar="S",
                   help="seconds to measure (default: %(default)s)")
    p.add_argument("--count", type=positive_int, default=None, metavar="N",
                   help="entries to write instead of --duration (default: use --duration)")
    p.add_argument("--concurrency", type=positive_int, default=64, metavar="C",
                   help="requests in flight (default: %(default)s)")
    p.add_argument("--batch", type=positive_int, default=1, metavar="K",
                   help="bodies per request, 1 = single appends (default: %(default)s)")
    p.add_argument("--mode", choices=("async", "sync"), default="async",
                   help="async: one pipelined client; sync: --concurrency waiting threads "
                        "(default: %(default)s)")
    p.add_argument("--warmup", type=nonneg_float, default=1.0, metavar="S",
                   help="seconds before measuring (default: %(default)s)")
    p.add_argument("--verify-sample", type=nonneg_int, default=1000, metavar="N",
                   help="acknowledged indexes to read back (default: %(default)s)")
    p.add_argument("--max-error-rate", type=fraction, default=0.0, metavar="F",
                   help="fail (exit 1) above this fraction of failed requests (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object (default: a line)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw throughput and latency over time (default: no plot)")
    p.add_argument("--timeout", type=positive_float, default=10.0, metavar="S",
                   help="per-request client timeout in seconds (default: %(default)s)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra `dledger server` argument for --local, repeatable (default: none)")
    p.add_argument("--secure", action="store_true",
                   help="--local: a secure group (CurveZMQ keys made for it, docs/operations.md "
                        "\"Security\"); default: plain, as a loopback bench")
    p.add_argument("--key-file", default=None, metavar="FILE",
                   help="--peers: this client's secret key for a secure group (default: "
                        "$DLEDGER_KEY_FILE; none: plain)")
    p.add_argument("--local-link", action="store_true",
                   help="--local: reach the first leader through shared memory, as a process on "
                        "its machine does (DLedgerClient local_store_dir=; docs/client.md "
                        "\"Local clients\"); default: TCP")
    p.add_argument("--kv", action="store_true",
                   help="bench the KV store (--state-machine kv): puts and linearizable gets "
                        "(default: the log)")
    p.add_argument("--kv-op", choices=("put", "get", "mixed"), default="put",
                   help="--kv: what each op is; mixed = alternate put and get (default: %(default)s)")
    p.add_argument("--keys", type=positive_int, default=10_000, metavar="N",
                   help="--kv: key space (default: %(default)s)")


_FILL: dict[int, bytes] = {}


def _body(seq: int, size: int) -> bytes:
    """Deterministic per sequence number (an 8-byte prefix and a fixed fill), so read-back can
    check every byte; cheap, because the load generator shares the machine with the group."""
    head = _SEQ.pack(seq)
    if size <= 8:
        return head[-size:] if size else b""
    fill = _FILL.get(size)
    if fill is None:
        fill = _FILL[size] = (bytes(range(256)) * (size // 256 + 1))[: size - 8]
    return head + fill


class Bench:
    def __init__(self, args: argparse.Namespace, peers: str, key_file: str | os.PathLike[str] | None = None
                 ) -> None:
        self.a = args
        self.peers = peers
        self.key_file = key_file  # a secure group: the client's secret key
        self.local_store_dir: str | None = None  # --local-link: the leader's store directory
        self.stop_at = 0.0
        self.seq = 0
        self.seq_lock = threading.Lock()
        self.written = 0

    def _next(self, n: int) -> int:
        with self.seq_lock:
            s = self.seq
            self.seq += n
            return s

    def _done(self) -> bool:
        if self.a.count is not None:
            return self.seq >= self.a.count + self._warm_entries
        return time.perf_counter() >= self.stop_at

    def run(self, progress: BenchProgress) -> Recorder:
        """Find the leader, prepare, load for --warmup + --duration (or --count), read back."""
        a = self.a
        self.progress = progress
        with DLedgerClient(self.peers, group=a.group, timeout=a.timeout,
                           max_in_flight=a.concurrency + 1,  # the window is ours: _run_async
                           max_body_size=body_limit(a.server_arg), key_file=self.key_file,
                           local_store_dir=self.local_store_dir) as c:
            c.metadata()  # find the leader before the clock starts mattering
            self._prepare(c)
            t0 = time.perf_counter()
            rec = Recorder(t0, t0 + a.warmup, self.OPS, verify_sample=a.verify_sample)
            self._warm_entries = self.seq  # --count counts from here
            self.stop_at = t0 + a.warmup + a.duration
            progress.phase("warmup" if a.warmup else "measuring",
                           a.count if a.count is not None else a.warmup + a.duration)
            if self._pipelined(c):
                self._run_async(c, rec)
            else:
                threads = [threading.Thread(target=self._sync_worker, args=(c, rec), daemon=True)
                           for _ in range(a.concurrency)]
                for t in threads:
                    t.start()
                while any(t.is_alive() for t in threads):
                    self._tick(rec)
                    time.sleep(0.25)
                for t in threads:
                    t.join()
            self._tick(rec)
            self.verify_result = self._verify(c, rec)
        return rec

    OPS: tuple[str, ...] = ("",)  # the Recorder's ops: the log has one kind

    def _tick(self, rec: Recorder) -> None:
        """Move the load phase's bar: seconds (of warmup + duration) or entries (of --count)."""
        a = self.a
        now = time.perf_counter()
        if a.count is not None:
            done = min(self.seq - self._warm_entries, a.count)
        else:
            done = min(now - rec.t0, a.warmup + a.duration)
        self.progress.update(done, _live_figures(rec, a),
                             description="warmup" if now < rec.measuring_from else "measuring")

    def _prepare(self, c: DLedgerClient) -> None:
        """Work before the clock starts (the log bench has none)."""

    def _pipelined(self, c: DLedgerClient) -> bool:
        """One pipelined client (`_submit`) rather than --concurrency threads (`_sync_worker`)."""
        return self.a.mode == "async"

    def _submit(self, c: DLedgerClient, rec: Recorder):  # noqa: ANN202
        a = self.a
        seq = self._next(a.batch)
        sent = time.perf_counter()
        if a.batch == 1:
            f = c.append_async(_body(seq, a.size))
        else:
            f = c.append_batch_async([_body(seq + i, a.size) for i in range(a.batch)])

        def done(fut, seq=seq, sent=sent) -> None:  # noqa: ANN001
            e = fut.exception()  # not result(): re-raising the stored exception here would tie
            if e is not None:    # it, its traceback and this frame into a cycle per failure
                rec.fail(e)
                return
            r = fut.result()
            first = r.index if a.batch == 1 else r[0].index
            rec.ok(sent, a.batch, first, seq)

        f.add_done_callback(done)
        return f

    def _run_async(self, c: DLedgerClient, rec: Recorder) -> None:
        """Keep --concurrency requests in flight. The window is this semaphore, taken before
        `_submit` reads the clock: had the client's own `max_in_flight` been the window, the
        submit would block inside `append_async` after `sent` was taken, and every latency
        would include the wait for the previous answer (with one in flight, twice the real
        round trip). The client gets one slot more, so it never blocks: its slot is freed
        after the done callbacks, which release this window."""
        last_progress = 0.0
        pending: list = []
        window = threading.BoundedSemaphore(self.a.concurrency)
        while not self._done():
            window.acquire()
            f = self._submit(c, rec)
            f.add_done_callback(lambda _f: window.release())  # after _submit's own callback
            pending.append(f)
            if len(pending) > 4 * self.a.concurrency:
                pending = [f for f in pending if not f.done()]
            now = time.perf_counter()
            if now - last_progress >= 0.25:
                self._tick(rec)
                last_progress = now
        for f in pending:
            try:
                f.result(timeout=self.a.timeout + 5)
            except DLedgerError:
                pass

    def _sync_worker(self, c: DLedgerClient, rec: Recorder) -> None:
        a = self.a
        while not self._done():
            seq = self._next(a.batch)
            sent = time.perf_counter()
            try:
                if a.batch == 1:
                    first = c.append(_body(seq, a.size)).index
                else:
                    first = c.append_batch([_body(seq + i, a.size) for i in range(a.batch)])[0].index
                rec.ok(sent, a.batch, first, seq)
            except DLedgerError as e:
                rec.fail(e)

    def _verify(self, c: DLedgerClient, rec: Recorder) -> dict:
        """Read back a sample of acknowledged entries; every byte must match.

        Entries the group has since deleted by retention (below the leader's ledger begin) are
        not a failure — a long run at peak on a group with little reserved time deletes its
        oldest files while it runs — so the sample is drawn from what is still kept, and a read
        that finds its entry deleted meanwhile is counted apart, never as a mismatch."""
        begin = _leader_begin(c)
        kept = [(first, seq) for first, seq in rec.acked if first >= begin]
        sample = random.Random(7).sample(kept, min(self.a.verify_sample, len(kept)))
        bad = retired = 0
        self.progress.phase("read-back", len(sample))
        for done, (first, seq) in enumerate(sample, 1):
            k = random.Random(first).randrange(self.a.batch)
            try:
                e = c.get(first + k)
                if e.body != _body(seq + k, self.a.size):
                    bad += 1
            except DLedgerError as err:
                if err.code == RC.INDEX_OUT_OF_RANGE and first + k < _leader_begin(c):
                    retired += 1
                else:
                    bad += 1
            self.progress.update(done, f"mismatched {bad}")
        return {"checked": len(sample) - retired, "mismatched": bad,
                "deleted_by_retention": len(rec.acked) - len(kept) + retired}


class _Refused(Exception):
    """An op the store answered with something other than success (counted by `name`)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class KVBench(Bench):
    """--kv: puts (appends of KV PUT commands, as `KVClient.put`) and linearizable gets
    (queries of KV GETs, as `KVClient.get`) over `--keys` keys of `--size`-byte values.

    Each key's newest acknowledged put (highest revision) is remembered; a key with a failed
    put is "doubtful" (the put may have landed) and left out of the read-back."""

    PRELOAD_BATCH = 64
    OPS = ("put", "get")

    def __init__(self, args: argparse.Namespace, peers: str,
                 key_file: str | os.PathLike[str] | None = None) -> None:
        super().__init__(args, peers, key_file)
        self.keys = [b"k%07d" % i for i in range(args.keys)]
        self.last: dict[int, tuple[int, int]] = {}  # key number -> (revision, seq) of the newest put
        self.doubtful: set[int] = set()
        self.kv_lock = threading.Lock()
        self.gets_compared = 0
        self.gets_mismatched = 0
        self.get_path: str | None = None

    # ---- which op, which key -----------------------------------------------------------------
    def _op(self, seq: int) -> tuple[str, int]:
        """(op, key number). Puts walk the keys in order (etcd's benchmark does); mixed
        alternates put and get, each get reading the key the put before it wrote."""
        op = self.a.kv_op
        if op == "mixed":
            return ("get" if seq & 1 else "put"), (seq >> 1) % len(self.keys)
        return op, seq % len(self.keys)

    def _put_done(self, rec: Recorder, sent: float, seq: int, k: int, r: object) -> None:
        """Record an acknowledged put (`r` an AppendResult): the result says the store took it."""
        rev = r.index  # type: ignore[attr-defined]
        if r.result is not None:  # type: ignore[attr-defined]
            try:
                res = K.decode_result(r.result)  # type: ignore[attr-defined]
            except ValueError:
                rec.fail(_Refused("NOT_A_KV_RESULT"))  # the group runs another state machine
                return
            if res.status != K.Status.OK:
                rec.fail(_Refused(res.status.name))
                return
            rev = res.revision
        with self.kv_lock:
            old = self.last.get(k)
            if old is None or rev > old[0]:
                self.last[k] = (rev, seq)
        rec.op_ok(sent, "put")

    def _put_failed(self, rec: Recorder, k: int, e: BaseException) -> None:
        with self.kv_lock:
            self.doubtful.add(k)
        rec.fail(e)

    def _get_done(self, rec: Recorder, sent: float, k: int, answer: bytes) -> None:
        try:
            reply = K.decode_query_reply(answer)
        except ValueError:
            rec.fail(_Refused("NOT_A_KV_REPLY"))
            return
        if reply.status != K.Status.OK or not reply.items:
            rec.fail(_Refused(reply.status.name))
            return
        rec.op_ok(sent, "get")
        if self.a.kv_op == "get":  # nothing writes during the run: the answer is known
            rev, seq = self.last[k]
            it = reply.items[0]
            good = it.value == _body(seq, self.a.size) and it.mod_revision == rev
            with self.kv_lock:
                self.gets_compared += 1
                self.gets_mismatched += not good

    # ---- before the clock ----------------------------------------------------------------------
    def _prepare(self, c: DLedgerClient) -> None:
        """Gets need keys: put every key once, in batches, before measuring."""
        if self.a.kv_op == "put":
            return
        self.get_path = ("query_async (one pipelined client)" if self._pipelined(c)
                         else f"query ({self.a.concurrency} threads)")
        rec = Recorder(time.perf_counter(), 0.0, self.OPS)
        self.progress.phase("putting keys", len(self.keys))
        futures = []
        for first in range(0, len(self.keys), self.PRELOAD_BATCH):
            ks = range(first, min(first + self.PRELOAD_BATCH, len(self.keys)))
            seq0 = self._next(len(ks))
            f = c.append_batch_async([K.encode_put(self.keys[k], _body(seq0 + i, self.a.size))
                                      for i, k in enumerate(ks)])
            futures.append((f, ks, seq0))
        for f, ks, seq0 in futures:
            try:
                for i, (k, r) in enumerate(zip(ks, f.result(self.a.timeout + 5), strict=True)):
                    self._put_done(rec, 0.0, seq0 + i, k, r)
            except DLedgerError as e:
                raise CliError(f"putting the {len(self.keys):,} keys before the gets failed: {e}") from None
            self.progress.update(ks[-1] + 1)
        if rec.first_error is not None:
            raise CliError(f"putting the keys before the gets failed: {rec.first_error}")

    def _pipelined(self, c: DLedgerClient) -> bool:
        if self.a.mode != "async":
            return False
        return self.a.kv_op == "put" or hasattr(c, "query_async")

    # ---- the ops -------------------------------------------------------------------------------
    def _submit(self, c: DLedgerClient, rec: Recorder):  # noqa: ANN202
        seq = self._next(1)
        op, k = self._op(seq)
        sent = time.perf_counter()
        if op == "put":
            f = c.append_async(K.encode_put(self.keys[k], _body(seq, self.a.size)))

            def done(fut, seq=seq, sent=sent, k=k) -> None:  # noqa: ANN001
                e = fut.exception()  # not result(): see Bench._submit
                if e is not None:
                    self._put_failed(rec, k, e)
                else:
                    self._put_done(rec, sent, seq, k, fut.result())
        else:
            f = c.query_async(K.encode_get(self.keys[k]))  # type: ignore[attr-defined]

            def done(fut, sent=sent, k=k) -> None:  # noqa: ANN001
                e = fut.exception()
                if e is not None:
                    rec.fail(e)
                else:
                    self._get_done(rec, sent, k, fut.result().answer)

        f.add_done_callback(done)
        return f

    def _sync_worker(self, c: DLedgerClient, rec: Recorder) -> None:
        while not self._done():
            seq = self._next(1)
            op, k = self._op(seq)
            sent = time.perf_counter()
            if op == "put":
                try:
                    r = c.append(K.encode_put(self.keys[k], _body(seq, self.a.size)))
                except DLedgerError as e:
                    self._put_failed(rec, k, e)
                    continue
                self._put_done(rec, sent, seq, k, r)
            else:
                try:
                    answer = c.query(K.encode_get(self.keys[k])).answer
                except DLedgerError as e:
                    rec.fail(e)
                    continue
                self._get_done(rec, sent, k, answer)

    # ---- after ---------------------------------------------------------------------------------
    def _verify(self, c: DLedgerClient, rec: Recorder) -> dict:
        """Read back a sample of keys (linearizable gets, 16 at a time): each must hold the
        value and revision of its newest acknowledged put."""
        with self.kv_lock:
            sure = sorted(k for k in self.last if k not in self.doubtful)
        sample = random.Random(7).sample(sure, min(self.a.verify_sample, len(sure)))

        def same(k: int) -> bool:
            rev, seq = self.last[k]
            try:
                reply = K.decode_query_reply(c.query(K.encode_get(self.keys[k])).answer)
            except (DLedgerError, ValueError):
                return False
            return (reply.status == K.Status.OK and len(reply.items) == 1
                    and reply.items[0].value == _body(seq, self.a.size) and reply.items[0].mod_revision == rev)

        self.progress.phase("read-back", len(sample))
        bad = 0
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            for done, ok in enumerate(pool.map(same, sample), 1):
                bad += not ok
                self.progress.update(done, f"mismatched {bad}")
        return {"checked": len(sample), "mismatched": bad, "doubtful_keys": len(self.doubtful),
                "gets_compared": self.gets_compared, "gets_mismatched": self.gets_mismatched}


def _leader_begin(c: DLedgerClient) -> int:
    """The leader's ledger begin (0 when unknown: then nothing counts as deleted)."""
    try:
        m = c.metadata()
    except DLedgerError:
        return 0
    lead = m.node(m.leader_id) if m.leader_id else None
    return lead.ledger_begin_index if lead is not None and lead.ledger_begin_index else 0


def _unit(args: argparse.Namespace) -> str:
    return "ops" if getattr(args, "kv", False) else "entries"


def _figures(h: HdrHistogram, entries: int, span: float) -> dict:
    """Throughput and latency percentiles of one histogram over the measured `span` seconds."""
    return {"per_s": entries / span, "p50_ms": percentile_ms(h, 50), "p99_ms": percentile_ms(h, 99),
            "p999_ms": percentile_ms(h, 99.9),
            "max_ms": h.get_max_value() / 1000.0 if h.get_total_count() else 0.0}


def _live_figures(rec: Recorder, args: argparse.Namespace) -> str:
    """The newest finished second, for the live view."""
    sec, errors = rec.live()
    if sec is None:
        return f"errors {errors}"
    return (f"{sec.entries:>9,} {_unit(args)}/s {sec.entries * args.size / 1e6:7.1f} MB/s  "
            f"p99 {sec.p99_ms:7.2f} ms  errors {errors}")


def summarize(rec: Recorder, args: argparse.Namespace) -> dict:
    """The log's figures in entries (`entries_per_s`, `entries`, per-second `entries`); --kv's
    in ops (`ops_per_s`, `ops`, per-second `ops`), with `by_op` for --kv-op mixed.

    The window runs from the end of the warmup to the last acknowledgement; `samples` are its
    whole seconds only (a partial last one would look like a stall)."""
    unit = _unit(args)
    start = rec.measuring_from
    rec.close()
    with rec.lock:
        end = max(rec.last_done, start + 1e-9)
        span = end - start
        entries = sum(rec.entries.values())
        f = _figures(rec.merged(), entries, span)
        errs = sum(rec.errors_by_code.values())
        samples = [{"t": s.t, unit: s.entries, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms, "errors": s.errors}
                   for s in rec.seconds if start + s.t + 1 <= end]
        requests = rec.requests
        errors_by_code = dict(sorted(rec.errors_by_code.items()))
    keys = ["size", "duration", "count", "concurrency", "batch", "mode", "warmup", "local", "peers"]
    if unit == "ops":
        keys += ["kv_op", "keys"]
    res = {
        f"{unit}_per_s": f["per_s"], "mb_per_s": entries * args.size / span / 1e6,
        "requests_per_s": requests / span, "p50_ms": f["p50_ms"], "p99_ms": f["p99_ms"],
        "p999_ms": f["p999_ms"], "max_ms": f["max_ms"], "errors": errs,
        "error_kinds": sorted(errors_by_code), "error_rate": errs / (requests + errs) if requests + errs else 0.0,
        "errors_by_code": errors_by_code,
        unit: entries, "seconds": span,
        "config": {k: getattr(args, k) for k in keys},
        "samples": samples,
    }
    res["config"]["secure"] = bool(getattr(args, "secure", False) or getattr(args, "key_file", None))
    if unit == "ops" and args.kv_op == "mixed":  # closed above: nothing records any more
        res["by_op"] = {op: _figures(rec.hist[op], rec.entries[op], span) for op in ("put", "get")}
    return res


def _plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = "ops" if "ops" in res else "entries"
    t = [s["t"] for s in res["samples"]]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    ax1.plot(t, [s[unit] for s in res["samples"]], marker=".")
    ax1.set_ylabel(f"{unit} / s")
    what = f"kv {res['config']['kv_op']}" if unit == "ops" else f"batch {res['config']['batch']}"
    ax1.set_title(f"dledger bench: {res['config']['mode']}, {what}, "
                  f"{res['config']['size']} B, concurrency {res['config']['concurrency']}")
    ax2.plot(t, [s["p50_ms"] for s in res["samples"]], label="p50")
    ax2.plot(t, [s["p99_ms"] for s in res["samples"]], label="p99")
    ax2.set_ylabel("latency (ms)")
    ax2.set_xlabel("seconds")
    ax2.legend()
    errs = [s["t"] for s in res["samples"] if s["errors"]]
    for x in errs:
        ax1.axvline(x, color="red", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


class _RssSampler:
    """Samples the local group's anonymous memory every 10 s on a thread, so a long run shows
    whether memory levels off once the group is warm (the first seconds allocate the steady
    state's buffers) or keeps growing."""

    PERIOD_S = 10.0

    def __init__(self, group: LocalGroup) -> None:
        self.group = group
        self.t0 = time.monotonic()
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.PERIOD_S):
            self.samples.append((time.monotonic() - self.t0, self.group.rss_by_process()))

    def stop(self, final: dict[int, int]) -> dict:
        """`samples` (t, total MB) and the largest growth of one process after the first sample
        (None for runs shorter than one period)."""
        self.done.set()
        self.thread.join()
        if not self.samples:
            return {"samples": [], "max_growth_one_process_after_warmup": None}
        warm = self.samples[0][1]
        growth = max((final[p] - warm[p] for p in final if p in warm), default=0)
        return {"samples": [{"t": round(t), "total": sum(r.values()) / 1e6} for t, r in self.samples],
                "max_growth_one_process_after_warmup": growth / 1e6}


def body_limit(server_args: list[str]) -> int:
    """The largest body the benched group takes: the server's --max-body-size when this bench
    starts the group with one (--server-arg), else the default every node and the client share
    (ipc.protocol.DEFAULT_MAX_BODY, `max-body-size` in docs/operations.md)."""
    from ipc.protocol import DEFAULT_MAX_BODY
    from tools.cli import size_arg

    limit = DEFAULT_MAX_BODY
    for i, a in enumerate(server_args):
        text = (a.partition("=")[2] if a.startswith("--max-body-size=")
                else server_args[i + 1] if a == "--max-body-size" and i + 1 < len(server_args) else None)
        if text is not None:
            try:
                limit = size_arg(text)
            except argparse.ArgumentTypeError:
                pass  # the server refuses it itself, in one line
    return limit


def run(args: argparse.Namespace) -> int:
    if args.local_link and not args.local:
        raise CliError("--local-link needs --local N (the bench must run on the leader's machine "
                       "and know its store directory)", 2)
    if args.size < 0 or args.batch < 1 or args.concurrency < 1:
        raise CliError("--size must be >= 0, --batch and --concurrency >= 1", 2)
    server_args = list(args.server_arg)
    limit = body_limit(server_args)
    if args.size > limit:  # every request would fail: refuse before starting anything
        raise CliError(f"--size {args.size} bytes is over the largest body a node accepts "
                       f"({limit} bytes, max-body-size; every append would be refused)", 2)
    if args.kv:
        if args.batch != 1:
            raise CliError("--kv sends one op per request: --batch must be 1", 2)
        if args.keys < 1 or args.size > K.MAX_VALUE_SIZE:
            raise CliError(f"--kv needs --keys >= 1 and --size <= {K.MAX_VALUE_SIZE}", 2)
        if not any(x == "--state-machine" or x.startswith("--state-machine=") for x in server_args):
            server_args += ["--state-machine", "kv"]
    group = None
    peers = args.peers
    progress = BenchProgress(quiet=args.json)
    progress.phase("start-up")
    try:
        key_file = None if args.local else key_file_of(args)
        if args.local:
            group = LocalGroup(args.local, server_args, group=args.group, secure=args.secure).start()
            peers = group.peers
            key_file = group.key_file
            first_leader = group.wait_leader()[0]
        bench = KVBench(args, peers, key_file) if args.kv else Bench(args, peers, key_file)
        if args.local_link:
            bench.local_store_dir = str(group.root / first_leader)
        rss_before = group.rss_by_process() if group else {}
        leader_before = group.leader() if group else None
        sampler = _RssSampler(group) if group else None
        # Fewer, cheaper collections (they add client jitter), but never none: a run that fails
        # fast (DISK_FULL, NOT_LEADER storms) creates garbage at the request rate, and with the
        # collector off one cycle per failure was enough to grow the bench by 350 MB/s.
        gc.collect()
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(50_000, 50, 100)
        try:
            rec = bench.run(progress)
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
        res = summarize(rec, args)
        res["verified"] = bench.verify_result
        if isinstance(bench, KVBench):
            res["kv"] = {"op": args.kv_op, "keys": args.keys, "value_size": args.size,
                         "put_path": ("append_async (one pipelined client)" if args.mode == "async"
                                      else f"append ({args.concurrency} threads)"),
                         "get_path": bench.get_path}
        res["client_max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if group is not None:
            rss_after = group.rss_by_process()
            res["rss_anon_mb"] = {
                "before": sum(rss_before.values()) / 1e6, "after": sum(rss_after.values()) / 1e6,
                "max_growth_one_process": max((rss_after[p] - rss_before.get(p, rss_after[p])
                                               for p in rss_after), default=0) / 1e6,
                **sampler.stop(rss_after)}
            res["leader"] = {"before": leader_before, "after": group.leader()}
        if args.plot:
            _plot(res, args.plot)
    finally:
        progress.stop()
        if group is not None:
            group.close()
    v = res["verified"]
    ok = res["error_rate"] <= args.max_error_rate and v["mismatched"] == 0 and not v.get("gets_mismatched")
    unit = _unit(args)
    if args.json:
        print(json.dumps(res))
    else:
        compared = (f"  gets compared {v['gets_compared'] - v['gets_mismatched']}/{v['gets_compared']}"
                    if v.get("gets_compared") else "")
        print(f"{res[unit + '_per_s']:,.0f} {unit}/s  {res['mb_per_s']:.1f} MB/s  "
              f"({res['requests_per_s']:,.0f} requests/s)  latency p50 {res['p50_ms']:.2f} ms  "
              f"p99 {res['p99_ms']:.2f} ms  p99.9 {res['p999_ms']:.2f} ms  errors {res['errors']}"
              + (" (" + ", ".join(f"{k} x{n:,}" for k, n in res["errors_by_code"].items()) + ")"
                 if res["errors"] else "") + "  "
              f"verified {res['verified']['checked'] - res['verified']['mismatched']}/"
              f"{res['verified']['checked']}" + retired_note(res["verified"]) + compared)
    return 0 if ok else 1


def retired_note(verified: dict) -> str:
    n = verified.get("deleted_by_retention", 0)
    return f" ({n:,} acknowledged requests' entries already deleted by retention)" if n else ""
