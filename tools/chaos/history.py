"""What a chaos run recorded, and the checks that judge it (pure: no processes, no sockets).

A run records every append a writer made (invoked, then acknowledged with an index and term,
or failed with a code, definite or indeterminate), every entry a reader got back, and every
(term, node) that claimed leadership. After the run each replica's store is decoded. `check`
then compares the three and lists every violation of what a consensus log promises:

- every replica's committed prefix is the same (term, type and body at each index);
- no acknowledged append is lost: its body is committed at the index and term it was
  acknowledged with;
- no body is committed twice (appends carry client sessions: a resend is deduplicated);
- an append that failed *definitely* (not indeterminate) is not committed;
- each writer's entries are committed in the order it submitted them;
- nothing is committed that nobody wrote;
- a read returned only committed entries, equal to the final log;
- at most one leader per term.

An indeterminate append may be committed or not, but at most once. Everything here is a
function of its inputs so tests can hand it crafted histories (tests/unit/test_chaos_history.py).
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

NORMAL = "NORMAL"
MAX_LISTED = 20  # violations of one kind listed one by one; the rest are counted


@dataclass(slots=True)
class Append:
    """One append as the writer saw it. Times are seconds since the run started."""

    writer: str
    seq: int  # the writer's submission number: its entries must be committed in this order
    body: bytes
    t_invoke: float
    t_done: float | None = None
    index: int | None = None
    term: int | None = None
    error: str | None = None  # the DLedgerError name, when it failed
    indeterminate: bool = False

    @property
    def acknowledged(self) -> bool:
        return self.index is not None

    def label(self) -> str:
        return f"{self.writer}#{self.seq}"


@dataclass(frozen=True, slots=True)
class ReadEntry:
    """One entry a reader got back at time `t`."""

    t: float
    index: int
    term: int
    type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class LogEntry:
    index: int
    term: int
    type: str
    body: bytes
    crc_ok: bool = True


@dataclass(slots=True)
class Replica:
    """One node's store after the run: its committed index and entries from its begin."""

    node: str
    committed_index: int
    entries: list[LogEntry]

    def committed(self) -> list[LogEntry]:
        return [e for e in self.entries if e.index <= self.committed_index]


@dataclass(slots=True)
class History:
    """Thread-safe recorder shared by the workload threads."""

    appends: list[Append] = field(default_factory=list)
    reads: list[ReadEntry] = field(default_factory=list)
    leader_claims: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def invoked(self, op: Append) -> Append:
        with self.lock:
            self.appends.append(op)
        return op

    def read(self, entries: Iterable[ReadEntry]) -> None:
        with self.lock:
            self.reads.extend(entries)

    def claim(self, term: int, node: str) -> None:
        with self.lock:
            self.leader_claims[term].add(node)


@dataclass(slots=True)
class Verdict:
    violations: list[str]
    stats: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.violations


class _Violations:
    """Collects violation lines, at most MAX_LISTED per kind, and counts the rest."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.per_kind: Counter[str] = Counter()

    def add(self, kind: str, text: str) -> None:
        self.per_kind[kind] += 1
        if self.per_kind[kind] <= MAX_LISTED:
            self.lines.append(f"{kind}: {text}")

    def result(self) -> list[str]:
        out = list(self.lines)
        out += [f"{kind}: ... and {n - MAX_LISTED} more" for kind, n in self.per_kind.items() if n > MAX_LISTED]
        return out


def final_log(replicas: Mapping[str, Replica]) -> dict[int, LogEntry]:
    """The committed log as the replicas hold it together (index -> entry): the most advanced
    replica's committed entries, plus what others still hold below its begin (retention and
    installed snapshots delete prefixes, at different points on different nodes). Every
    replica's committed prefix is checked against it; a replica's uncommitted tail is not."""
    out: dict[int, LogEntry] = {}
    for rep in sorted(replicas.values(), key=lambda r: r.committed_index, reverse=True):
        for e in rep.committed():
            out.setdefault(e.index, e)
    return out


def _same(a: LogEntry, b: LogEntry) -> bool:
    return a.term == b.term and a.type == b.type and a.body == b.body


def check(history: History, replicas: Mapping[str, Replica],
          extra_leader_claims: Mapping[int, Iterable[str]] | None = None, *,
          bodies_are_ours: bool = True) -> Verdict:
    """Every violation of the promises in the module docstring, as one line each.
    `bodies_are_ours` False (a KV run: bodies are KV commands, judged by the linearizability
    check instead) skips the "nothing committed that nobody wrote" check."""
    v = _Violations()
    final = final_log(replicas)
    _check_replicas(replicas, final, v)
    at: dict[bytes, list[int]] = defaultdict(list)
    for e in final.values():
        if e.type == NORMAL:
            at[e.body].append(e.index)
    appends = history.appends
    by_body = {op.body: op for op in appends}
    committed_end = max(final) if final else -1
    # Below what any replica still holds (deleted everywhere after a snapshot covered it):
    # nothing to compare with; counted, never a pass or a violation.
    compacted_below = min(final) if final else -1
    compacted = 0

    for op in appends:
        where = at.get(op.body, [])
        if op.acknowledged:
            e = final.get(op.index)
            if e is None and op.index < compacted_below:
                compacted += 1
                continue
            if e is None or e.body != op.body or e.term != op.term:
                held = ("nothing (beyond the committed end)" if e is None
                        else f"{e.type} term {e.term} body {e.body[:24]!r}")
                v.add("lost", f"{op.label()} acknowledged at index {op.index} term {op.term}, "
                              f"but the committed log holds {held} there")
        elif op.error is not None and not op.indeterminate and where:
            v.add("failed-but-committed", f"{op.label()} failed definitely ({op.error}) but is "
                                          f"committed at index {where[0]}")
        if len(where) > 1:
            v.add("duplicate", f"{op.label()} is committed {len(where)} times, at {where[:5]}")

    for body, idxs in at.items() if bodies_are_ours else ():
        if body not in by_body:
            v.add("unwritten", f"index {idxs[0]} holds a body no writer sent: {body[:32]!r}")

    _check_order(appends, at, v)

    claims: dict[int, set[str]] = defaultdict(set)
    for term, nodes in history.leader_claims.items():
        claims[term] |= set(nodes)
    for term, nodes in (extra_leader_claims or {}).items():
        claims[term] |= set(nodes)
    for term, nodes in sorted(claims.items()):
        if len(nodes) > 1:
            v.add("two-leaders", f"term {term} had leaders {sorted(nodes)}")

    bad_reads = 0
    for r in history.reads:
        e = final.get(r.index)
        if e is None and r.index < compacted_below:
            compacted += 1
            continue
        if e is None:
            bad_reads += 1
            v.add("read", f"a read at {r.t:.2f} s returned index {r.index}, beyond the committed "
                          f"end {committed_end}")
        elif e.term != r.term or e.type != r.type or e.body != r.body:
            bad_reads += 1
            v.add("read", f"a read at {r.t:.2f} s returned index {r.index} term {r.term} "
                          f"{r.body[:24]!r}; the committed log holds term {e.term} {e.body[:24]!r}")

    acked = [op for op in appends if op.acknowledged]
    failed_by_code = Counter(op.error for op in appends if op.error is not None and not op.indeterminate)
    indet = [op for op in appends if op.indeterminate]
    stats = {
        "appends": len(appends),
        "acknowledged": len(acked),
        "indeterminate": len(indet),
        "indeterminate_committed": sum(1 for op in indet if op.body in at),
        "failed_definitely": sum(failed_by_code.values()),
        "failed_by_code": dict(sorted(failed_by_code.items())),
        "first_failures": [[op.writer, op.seq, round(op.t_invoke, 2), round(op.t_done or -1, 2), op.error,
                            op.indeterminate] for op in sorted(appends, key=lambda o: o.t_invoke)
                           if op.error is not None][:10],
        "unfinished": sum(1 for op in appends if op.t_done is None),
        "reads": len(history.reads),
        "committed_end": committed_end,
        "compacted_below": compacted_below,
        "compacted_unchecked": compacted,
        "terms_with_leader": len(claims),
        "violations": sum(v.per_kind.values()),
    }
    return Verdict(v.result(), stats)


def _check_replicas(replicas: Mapping[str, Replica], final: Mapping[int, LogEntry], v: _Violations) -> None:
    for node, rep in sorted(replicas.items()):
        for e in rep.committed():
            if not e.crc_ok:
                v.add("corrupt", f"{node} index {e.index}: body CRC mismatch")
                break
        for e in rep.committed():
            f = final.get(e.index)
            if f is None:
                # Below the most advanced replica's begin (retention): nothing to compare.
                continue
            if not _same(e, f):
                v.add("divergence", f"{node} committed index {e.index} as term {e.term} {e.type} "
                                    f"{e.body[:24]!r}; another replica has term {f.term} {f.type} "
                                    f"{f.body[:24]!r}")
                break
        idx = [e.index for e in rep.committed()]
        if idx and idx != list(range(idx[0], idx[0] + len(idx))):
            v.add("gap", f"{node}: its committed entries are not contiguous")


def _check_order(appends: list[Append], at: Mapping[bytes, list[int]], v: _Violations) -> None:
    """Per writer, committed entries sorted by submission number have increasing indexes."""
    placed: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for op in appends:
        where = at.get(op.body)
        if where:
            placed[op.writer].append((op.seq, where[0]))
    for writer, pairs in sorted(placed.items()):
        pairs.sort()
        for (s0, i0), (s1, i1) in pairwise(pairs):
            if i1 <= i0:
                v.add("order", f"{writer}#{s1} is committed at index {i1}, before {writer}#{s0} at {i0}")
