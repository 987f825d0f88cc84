"""Is a recorded KV history linearizable? (docs/chaos.md; pure: no processes, no clocks but a budget.)

A chaos run against the KV store records what each client saw: an operation was *invoked* at
one time and *completed* at a later one with an output (a get's value, whether a cas swapped),
or never completed (the client timed out or lost its connection: it cannot know whether the
op took effect). The store promises linearizability: there is one order of all operations,
consistent with what a single map would have answered, in which an operation that completed
before another was invoked comes first. This module decides that for a history.

The model is a **register per key** (value or absent). put/get/cas/delete each touch one key, so
by P-compositionality (Horn & Kroening, "Faster linearizability checking via
P-compositionality", 2015) the history is linearizable iff every key's sub-history is, and each
key is checked on its own: small searches instead of one huge one.

Per key the search is Wing & Gong's, with Lowe's memoisation ("Testing for linearizability",
2017), as Porcupine does it (github.com/anishathalye/porcupine, checker.go): the call and return
events sorted by time in a doubly linked list; walk it, and at a call try to *linearize* that op
now (apply it to the model; if the output agrees, remember (op, previous state) on a stack,
*lift* its call and return out of the list and start again from the head); at a return whose
op is not linearized yet, the last choice was wrong: pop it, *unlift* it and try the next
candidate. The list empties: linearizable. A return with nothing to pop: not. The memo holds
every (linearized set, model state) reached; reaching one again cannot succeed where it failed
before, which is what turns an exponential search into a usually linear one. The set is a
Python int bitmask, stored in the memo as (length of its all-ones prefix, the bits above it)
with ops numbered in invocation order, so a key stays a few machine words however long the
history.

Two reductions of the search itself, both sound (a linearization exists iff the reduced search
finds one; the argument is in `_search`): a *forced read* — a get, a failed cas or a delete
that found nothing, whose recorded output matches the state now — is linearized at once with
no alternative tried (without this, k concurrent reads of one value cost 2**k states); and a
completed get or swapped cas that saw a value no op on the key ever wrote fails the key at
once, without a search.

**Indeterminate operations** (completion time None) may have taken effect at any moment after
their invocation, or never: their return is placed at +infinity, as Knossos and Porcupine do, so
the search may place them anywhere after the invocation, including after everything else (which
is "never" for every observer). Their output is unknown and never checked. Left alone they are
the search's worst case: every indeterminate write stays a candidate for the rest of the key's
history, and each wrong early placement is retried in every combination. These reductions keep
that in check (the first three are counted in each key's stats):

1. an indeterminate get is dropped: it changes nothing and its answer is unknown;
2. *resolved*: an indeterminate write (put, or cas) of a value that no other op on the key
   writes, and that some completed op observed (a get returned it, or a cas expecting it
   swapped), took effect, and before that observer returned, in every linearization. Its return
   time becomes the earliest such observer's return (a cas's output becomes "swapped"). This
   changes nothing about which orders are valid; it only tells the search;
3. *first pass without unobserved writes*: an indeterminate write whose value nobody observed
   is left out of a first search. Leaving an op out can only make a history harder to
   linearize (an indeterminate op can always be placed last), so a first-pass "ok" is final.
   If the first pass fails or runs out of budget, the key is searched again with every op
   (such a write can matter: it can be why a later cas failed), and that answer stands. In
   that second pass the unobserved writes are tried last at each point;
4. in the search, indeterminate ops with the same effect on every state (all deletes; puts of
   one value; every write of a value no op reads, which the models hold as one token) are
   interchangeable but for their invocation times: of those that are candidates, only the one
   invoked last is tried. One that would not change the state is not placed at all, and a
   configuration already shown to fail rules out the same one plus any indeterminate ops.

**Revisions** (separate, optional: ``revisions=True``, the default, when ops carry them). The KV
store's revision of a mutation is its log index (docs/statemachine.md): one store-wide counter
that increases with every successful mutation. Two checks follow, neither needed for the value
check above and each reported on its own (``check == "revisions"``):

- store-wide, no search: no revision is returned by two successful mutations, and a successful
  mutation that completed before another was invoked has the smaller revision;
- per key, a second search (run only once the value search succeeded) over a register that
  also holds the key's mod_revision and a lower bound on the last mutation's revision: a
  successful put / cas / delete with revision r needs r above every earlier mutation of the key;
  a get returning a value with revision r, and a failed cas with revision r (the key's
  mod_revision, 0 if absent), need the register's mod_revision to be r. A write whose revision
  is unknown (indeterminate, or not recorded) leaves the mod_revision unknown until an observer
  pins it.

**Budget.** Each key's search may add at most ``max_states`` memo entries, and the whole check
may take ``timeout`` seconds: past either, that key's verdict is ``unknown`` — neither proven
linearizable nor shown not to be — and the result is not ok. The budget is per search (a key
runs up to four: value and revisions, each with a first and a full pass). The default,
1,000,000 states, is a few seconds and a few hundred MB; what costs states is concurrency
*on one key* (each search is exponential in the ops that overlap), not history length.

Times are seconds on one clock (the chaos run's); an op that returned at exactly the time
another was invoked counts as concurrent with it (the events sort call-first), so a coarse
clock can hide a violation but never invent one. tests/unit/test_linearizability.py holds the
crafted histories and the property tests; docs/chaos.md "Linearizability check (KV)".
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

PUT: Final = "put"
GET: Final = "get"
CAS: Final = "cas"
DELETE: Final = "delete"
KINDS: Final = (PUT, GET, CAS, DELETE)

OK: Final = "ok"
FAIL: Final = "not-linearizable"
UNKNOWN: Final = "unknown"
Verdict = Literal["ok", "not-linearizable", "unknown"]

DEFAULT_MAX_STATES: Final = 1_000_000
MAX_LISTED: Final = 20  # store-wide revision violations listed one by one; the rest counted
EXPLAIN_PREFIX: Final = 8  # linearized ops shown before the one that could not be placed
_INF: Final = math.inf
_UNREAD: Final = object()  # stands for every written value that no op reads or compares


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True, slots=True)
class Operation:
    """One KV operation as a client saw it. Times are seconds on the run's clock.

    ``value`` is what a put or cas writes, ``expected`` what a cas compares against (None:
    the key must be absent). ``output``: a get's value (None: absent); a cas's ``True`` if it
    swapped, ``False`` if not; a delete's ``True`` if the key was there, ``False`` if not,
    ``None`` if the client did not learn which; ignored for a put. ``t_done`` None means the
    client never learned the outcome (indeterminate): the output is then ignored too.

    ``revision``, when known: a successful put / cas / delete's revision; a get's mod_revision
    of the value it returned; a failed cas's revision (the key's mod_revision, 0 if absent).
    A delete of an absent key reports the store's revision, which says nothing about the key:
    it is ignored.
    """

    client: str
    kind: str
    key: Hashable
    t_invoke: float
    t_done: float | None
    value: Hashable | None = None
    expected: Hashable | None = None
    output: object = None
    revision: int | None = None

    def __post_init__(self) -> None:
        # A malformed record is a bug in the workload that made it; fail at the record, not
        # in the middle of a search with a confusing verdict.
        if self.kind not in KINDS:
            raise ValueError(f"operation kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.t_done is not None and self.t_done < self.t_invoke:
            raise ValueError(f"{self.client} {self.kind}: completed at {self.t_done} before its "
                             f"invocation at {self.t_invoke}")
        if self.kind in (PUT, CAS) and self.value is None:
            raise ValueError(f"{self.client} {self.kind}: no value to write")
        if self.t_done is not None:
            if self.kind == CAS and not isinstance(self.output, bool):
                raise ValueError(f"{self.client} cas completed without a bool output")
            if self.kind == DELETE and self.output is not None and not isinstance(self.output, bool):
                raise ValueError(f"{self.client} delete output must be True, False or None")

    # Constructors that read like the client API, for workloads and tests.
    @classmethod
    def put(cls, client: str, key: Hashable, value: Hashable, t_invoke: float,
            t_done: float | None, revision: int | None = None) -> Operation:
        return cls(client, PUT, key, t_invoke, t_done, value=value, revision=revision)

    @classmethod
    def get(cls, client: str, key: Hashable, result: Hashable | None, t_invoke: float,
            t_done: float | None, revision: int | None = None) -> Operation:
        return cls(client, GET, key, t_invoke, t_done, output=result, revision=revision)

    @classmethod
    def cas(cls, client: str, key: Hashable, expected: Hashable | None, new: Hashable,
            swapped: bool | None, t_invoke: float, t_done: float | None,
            revision: int | None = None) -> Operation:
        return cls(client, CAS, key, t_invoke, t_done, value=new, expected=expected,
                   output=swapped, revision=revision)

    @classmethod
    def delete(cls, client: str, key: Hashable, t_invoke: float, t_done: float | None,
               found: bool | None = None, revision: int | None = None) -> Operation:
        return cls(client, DELETE, key, t_invoke, t_done, output=found, revision=revision)

    @property
    def indeterminate(self) -> bool:
        return self.t_done is None

    @property
    def mutated(self) -> bool | None:
        """Did this op change the key? None when the record cannot tell."""
        if self.t_done is None:
            return None
        if self.kind == PUT:
            return True
        if self.kind == GET:
            return False
        return self.output  # cas: swapped; delete: found (None: unknown)

    def line(self) -> str:
        """One line for a report: ``[t_invoke, t_done] client get(k) -> v``."""
        done = "...   " if self.t_done is None else f"{self.t_done:.3f}"
        k = show(self.key)
        if self.kind == PUT:
            call, out = f"put({k}, {show(self.value)})", "ok"
        elif self.kind == GET:
            call, out = f"get({k})", show(self.output)
        elif self.kind == CAS:
            call = f"cas({k}, {show(self.expected)} -> {show(self.value)})"
            out = "swapped" if self.output is True else "not swapped" if self.output is False else "?"
        else:
            call = f"delete({k})"
            out = "found" if self.output is True else "not found" if self.output is False else "ok"
        if self.t_done is None:
            out = "? (indeterminate)"
        elif self.revision is not None:
            out += f" @{self.revision}"
        return f"[{self.t_invoke:.3f}, {done}] {self.client} {call} -> {out}"


def show(v: object, width: int = 24) -> str:
    """A value as a report shows it: ``absent`` for None, bytes and str cut to `width`."""
    if v is None:
        return "absent"
    if v is _UNREAD:
        return "(a value no op read)"
    text = repr(v) if isinstance(v, bytes | bytearray) else str(v)
    return text if len(text) <= width else text[:width - 3] + "..."


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why one key's history has no linearization, as far as the search got.

    The search's deepest point: it had linearized `prefix_length` ops (the last few are in
    `prefix_tail`, in that order), the register then held `state`, and `stuck` returned before
    any remaining candidate (`pending`: the ops invoked by then and not yet placed, `stuck`
    included) could be placed so that `stuck`'s output came out right. "Minimal-ish": another
    order of the prefix might fail elsewhere; this one is where the search went furthest.
    """

    key: Hashable
    check: str  # "value" or "revisions"
    prefix_length: int
    prefix_tail: tuple[Operation, ...]
    state: str
    stuck: Operation
    pending: tuple[Operation, ...]
    reason: str

    def lines(self) -> list[str]:
        out = [f"key {show(self.key)} ({self.check} check): {self.reason}"]
        skipped = self.prefix_length - len(self.prefix_tail)
        out.append(f"  longest linearizable prefix: {self.prefix_length} ops"
                   + (f" (last {len(self.prefix_tail)} shown, in linearization order)" if skipped else ""))
        out += [f"    {op.line()}" for op in self.prefix_tail]
        out.append(f"  register after it: {self.state}")
        out.append(f"  could not be placed: {self.stuck.line()}")
        others = [op for op in self.pending if op is not self.stuck]
        if others:
            out.append("  other ops pending at that point:")
            out += [f"    {op.line()}" for op in others]
        return out


@dataclass(slots=True)
class KeyResult:
    """One key's verdict and what it cost."""

    key: Hashable
    verdict: Verdict
    check: str = "value"  # which check decided a failure or an unknown
    ops: int = 0  # the key's ops, as given
    indeterminate: int = 0
    dropped_gets: int = 0  # indeterminate gets (reduction 1)
    resolved: int = 0  # indeterminate writes given a return time (reduction 2)
    unobserved: int = 0  # indeterminate writes left out of the first pass (reduction 3)
    passes: int = 0  # searches run (value and revision, first and full)
    states: int = 0  # memo entries added, all passes
    seconds: float = 0.0
    explanation: Explanation | None = None
    reason: str = ""  # for unknown: which budget ran out

    @property
    def ok(self) -> bool:
        return self.verdict == OK


@dataclass(slots=True)
class Result:
    """The whole history's verdict: ok only if every key is ok and no revision is out of order."""

    keys: dict[Hashable, KeyResult] = field(default_factory=dict)
    revision_violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def verdict(self) -> Verdict:
        if self.revision_violations or any(k.verdict == FAIL for k in self.keys.values()):
            return FAIL
        if any(k.verdict == UNKNOWN for k in self.keys.values()):
            return UNKNOWN
        return OK

    @property
    def ok(self) -> bool:
        """True only when proven: an unknown key is not ok."""
        return self.verdict == OK

    @property
    def failed(self) -> list[KeyResult]:
        return [k for k in self.keys.values() if k.verdict == FAIL]

    @property
    def unknown(self) -> list[KeyResult]:
        return [k for k in self.keys.values() if k.verdict == UNKNOWN]

    @property
    def key(self) -> Hashable | None:
        """The first key (in the history's order) with no linearization, if any."""
        failed = self.failed
        return failed[0].key if failed else None

    @property
    def explanation(self) -> Explanation | None:
        failed = self.failed
        return failed[0].explanation if failed else None

    def stats(self) -> dict[str, int | float]:
        ks = self.keys.values()
        return {
            "keys": len(self.keys),
            "ops": sum(k.ops for k in ks),
            "indeterminate": sum(k.indeterminate for k in ks),
            "resolved": sum(k.resolved for k in ks),
            "keys_failed": len(self.failed),
            "keys_unknown": len(self.unknown),
            "revision_violations": len(self.revision_violations),
            "states": sum(k.states for k in ks),
            "max_states_per_key": max((k.states for k in ks), default=0),
            "seconds": round(self.seconds, 3),
        }

    def lines(self, max_keys: int = 3) -> list[str]:
        """A short report for the chaos run: the verdict, then each failure explained."""
        s = self.stats()
        keys = f"{s['keys']} key" + ("" if s["keys"] == 1 else "s")
        head = (f"linearizability: {self.verdict}: {keys}, {s['ops']} ops "
                f"({s['indeterminate']} indeterminate, {s['resolved']} of them resolved), "
                f"{s['states']} states searched in {s['seconds']} s")
        out = [head]
        for k in self.failed[:max_keys]:
            if k.explanation is not None:
                out += k.explanation.lines()
        if len(self.failed) > max_keys:
            out.append(f"... and {len(self.failed) - max_keys} more keys with no linearization")
        out += [f"revision: {v}" for v in self.revision_violations]
        for k in self.unknown[:max_keys]:
            out.append(f"key {show(k.key)}: unknown: {k.reason}")
            if k.explanation is not None:
                out += k.explanation.lines()
        if len(self.unknown) > max_keys:
            out.append(f"... and {len(self.unknown) - max_keys} more keys unknown")
        return out


# --------------------------------------------------------------------------- models

# A model is (initial state, step). step(state, i) returns the state after op i, or _NO when
# op i cannot produce its recorded output from `state`. States must be hashable (memo keys).
_NO: Final = object()
_Step = Callable[[object, int], object]


@dataclass(frozen=True, slots=True)
class _Op:
    """An op as the search sees it: original record, effective return time and output."""

    op: Operation
    ret: float  # +inf for an unresolved indeterminate op
    output: object
    known: bool  # the output is checked (completed, or resolved)
    lazy: bool = False  # an unobserved indeterminate write (full pass): tried after the others


def _register(ops: Sequence[_Op], canonical: bool = True) -> _Step:
    """The value model: the state is the key's value, None when absent (every value no op
    reads is one, `_UNREAD`: see `_canonical`)."""
    kinds = [o.op.kind for o in ops]
    values = _canonical(ops) if canonical else [o.op.value for o in ops]
    expected = [o.op.expected for o in ops]
    outputs = [o.output for o in ops]
    known = [o.known for o in ops]

    def step(state: object, i: int) -> object:
        kind = kinds[i]
        if kind == GET:
            return state if state == outputs[i] else _NO
        if kind == PUT:
            return values[i]
        if kind == CAS:
            if state == expected[i]:
                return values[i] if (outputs[i] is not False or not known[i]) else _NO
            return state if (outputs[i] is not True or not known[i]) else _NO
        # delete
        found = outputs[i]
        if known[i] and found is not None and found != (state is not None):
            return _NO
        return None

    return step


def _with_revisions(ops: Sequence[_Op], canonical: bool = True) -> _Step:
    """The revision model: (value, mod_revision or None when unknown, lower bound on the
    revision of the key's last mutation). See the module docstring, "Revisions"."""
    kinds = [o.op.kind for o in ops]
    values = _canonical(ops) if canonical else [o.op.value for o in ops]
    expected = [o.op.expected for o in ops]
    outputs = [o.output for o in ops]
    known = [o.known for o in ops]
    revs = [o.op.revision if o.known else None for o in ops]

    def written(state: tuple, value: object, r: int | None) -> object:
        _, _, last = state
        if r is None:
            return (value, None, last)
        return (value, r, r) if r > last else _NO

    def observed(state: tuple, r: int | None) -> object:
        """`state`'s mod_revision as seen by an op reporting `r` (None: not reported)."""
        value, mod, last = state
        if r is None:
            return state
        if value is None:  # absent: a failed cas reports 0; a get of absent reports nothing
            return state if r in (0, None) else _NO
        if mod is None:  # the write that made `value` has an unknown revision: pin it
            return (value, r, r) if r > last else _NO
        return state if mod == r else _NO

    def step(state: object, i: int) -> object:
        assert isinstance(state, tuple)
        value = state[0]
        kind = kinds[i]
        if kind == GET:
            if value != outputs[i]:
                return _NO
            return state if value is None else observed(state, revs[i])
        if kind == PUT:
            return written(state, values[i], revs[i])
        if kind == CAS:
            if value == expected[i]:
                if outputs[i] is False and known[i]:
                    return _NO
                return written(state, values[i], revs[i])
            if outputs[i] is True and known[i]:
                return _NO
            return observed(state, revs[i])
        found = outputs[i]
        if known[i] and found is not None and found != (value is not None):
            return _NO
        if value is None:
            return state  # not found: the revision is the store's, not the key's
        r = revs[i] if found is not None else None  # found unknown: whose revision is it?
        if r is None:
            return (None, 0, state[2])
        return (None, 0, r) if r > state[2] else _NO

    return step


def _read_values(ops: Sequence[_Op]) -> set[object]:
    """Every value some op can tell apart from the others: a get's output, a cas's expected."""
    return ({o.op.output for o in ops if o.op.kind == GET}
            | {o.op.expected for o in ops if o.op.kind == CAS})


def _canonical(ops: Sequence[_Op]) -> list[object]:
    """The values written, with each value no op reads replaced by `_UNREAD`. No step's outcome
    depends on which unread value the register holds (none equals a get's output or a cas's
    expected value), so this changes no verdict; it lets the memo, and `_groups`, treat the
    writes of such values as one."""
    read = _read_values(ops)
    return [o.op.value if o.op.value in read else _UNREAD for o in ops]


def _show_state(state: object) -> str:
    if isinstance(state, tuple):
        value, mod, last = state
        rev = "unknown" if mod is None else str(mod)
        return f"{show(value)} (mod_revision {rev}, last mutation revision >= {last})"
    return show(state)


# --------------------------------------------------------------------------- the search


@dataclass(slots=True)
class _Outcome:
    verdict: Verdict
    states: int
    prefix: list[int] = field(default_factory=list)  # op ids in linearization order
    stuck: int = -1
    state: object = None
    pending: list[int] = field(default_factory=list)
    reason: str = ""


def _search(ops: Sequence[_Op], step: _Step, init: object, max_states: int,
            deadline: float | None) -> _Outcome:
    """Wing & Gong with Lowe's memo over the events of `ops` (module docstring).

    The list is kept in arrays (node 0 is the head, 2n+1 the tail, nodes 1..2n the events in
    time order) so lift and unlift are four index writes each, and the memo is a set of
    (linearized set, state) keys (the set in two parts: see `fin` and `lz` below).

    One addition for *loose* ops (return at +infinity, output unchecked), which otherwise stay
    candidates to the end of the history and are tried in every combination: loose ops of one
    ``group`` (same effect on every state, see `_groups`) are interchangeable but for their
    invocation times, so of the group's members that are candidates at a point only the one
    invoked last is tried. Any linearization placing an earlier-invoked member X there, with a
    later-invoked candidate Y placed later (or never), stays valid with X and Y swapped: Y can
    go where X was, X (invoked earlier) wherever Y was, and every output is unchanged.

    And *forced reads*: at a new configuration, a candidate that never changes the state given
    its recorded output (a get, a cas that did not swap, a delete that found nothing) and whose
    output matches the state now is linearized now, and nothing else is tried from there. Any
    linearization placing it later stays valid with it moved here: it changes no state, so no
    other output moves; and it is a candidate, so no op still pending returned before it was
    invoked. Without this, k concurrent reads of one value are tried in all 2**k subsets.

    And *no idle loose moves*: a loose op whose step leaves the state as it is (a cas whose
    expected value is not there, a delete of an absent key) is not placed: any completion
    after it is a completion without it, with it appended at the end, where it blocks nothing
    and cannot fail. Which is also why the search succeeds as soon as only loose ops remain.

    And *dominance*: if (L1, s) was exhausted without success, (L2, s) with L2 = L1 plus loose
    ops fails too (whatever completes L2 completes L1, with the extra loose ops appended), so
    it is not entered. Only exhausted configurations dominate, never ones still on the stack.
    It prunes only when the smaller configuration is explored first, so the unobserved writes
    of the full pass (`_Op.lazy`: rarely needed, since nobody saw them) are tried at each point
    after every other candidate. Order changes only the time to an answer, never the answer.
    """
    n = len(ops)
    events = sorted([(o.op.t_invoke, 0, i) for i, o in enumerate(ops)]
                    + [(o.ret, 1, i) for i, o in enumerate(ops)])
    tail = 2 * n + 1
    nxt = list(range(1, tail + 2))
    prv = list(range(-1, tail + 1))
    node_op = [0] * (tail + 1)
    is_call = [False] * (tail + 1)
    match = [0] * (tail + 1)
    call_node = [0] * n
    for pos, (_, kind, i) in enumerate(events, start=1):
        node_op[pos] = i
        if kind == 0:
            is_call[pos] = True
            call_node[i] = pos
        else:
            match[call_node[i]] = pos  # a call sorts before its own return
    # The linearized set as two bitmasks: `fin` over the finite ops in invocation order, `lz`
    # over the loose ones. The memo key stores `fin` as (how many leading ops are all in it,
    # the bits above those): the leading run grows with the search, so the key stays a few
    # machine words however long the history (a full bitmask of 4,000 ops is 500 bytes).
    groups = _groups(ops)
    order = sorted(range(n), key=lambda i: (ops[i].op.t_invoke, i))
    fbit = [0] * n
    lbit = [0] * n
    for rank, i in enumerate(j for j in order if groups[j] < 0):
        fbit[i] = 1 << rank
    for rank, i in enumerate(j for j in order if groups[j] >= 0):
        lbit[i] = 1 << rank
    all_fixed = (1 << sum(1 for g in groups if g < 0)) - 1
    if all_fixed == 0:
        return _Outcome(OK, 0)  # only loose ops: all of them at the end, in any order
    group_of = [groups[node_op[p]] if is_call[p] else -1 for p in range(tail + 1)]
    phase_of = [int(ops[node_op[p]].lazy) if is_call[p] else -1 for p in range(tail + 1)]
    has_lazy = any(o.lazy for o in ops)
    has_loose = any(g >= 0 for g in groups)

    # Ops that never change the state, given their recorded output (module docstring, "forced").
    readonly = [o.known and (o.op.kind == GET or (o.op.kind in (CAS, DELETE) and o.output is False))
                for o in ops]

    memo: set[tuple[int, int, int, object]] = set()
    exhausted: dict[tuple[int, int, object], list[int]] = {}  # (low, fin >> low, state) -> lz
    stack: list[tuple[int, object, bool, int]] = []  # (call node, state before, forced, phase)
    state = init
    fin = lz = 0
    phase = 0  # 0: the eager candidates; 1: the lazy ones, once the eager ones are spent
    best = -1
    out = _Outcome(OK, 0)
    e = nxt[0]
    fresh = True  # a configuration not seen yet: look for a forced read first
    spins = 0
    while nxt[0] != tail:
        spins += 1
        if deadline is not None and not spins & 0x3FF and time.monotonic() > deadline:
            return _Outcome(UNKNOWN, len(memo), reason="timeout")
        back = False
        if fresh:
            fresh = False
            p = nxt[0]
            while is_call[p]:
                i = node_op[p]
                if readonly[i]:
                    new = step(state, i)
                    if new is not _NO and (new is state or new == state):
                        break
                p = nxt[p]
            if is_call[p]:  # a forced read: the only move worth trying from here
                f = fin | fbit[i]
                low = (f ^ (f + 1)).bit_length() - 1
                k = (low, f >> low, lz, state)
                if k in memo or (lz and _dominated(exhausted.get((low, k[1], state)), lz)):
                    back = True  # done before, without success: so is this configuration
                else:
                    memo.add(k)
                    if len(memo) > max_states:
                        return _Outcome(UNKNOWN, len(memo), reason=f"budget of {max_states:,} "
                                        f"states spent (deepest linearizable prefix: {max(best, 0)} of {n} ops)")
                    if f == all_fixed:
                        return _Outcome(OK, len(memo))
                    stack.append((p, state, True, phase))
                    fin, phase = f, 0
                    _lift(p, match[p], nxt, prv)
                    e = nxt[0]
                    fresh = True
                    continue
        if not back:
            if is_call[e]:
                if phase_of[e] != phase:
                    e = nxt[e]
                    continue
                g = group_of[e]
                if g >= 0:  # a loose op: skip it if a later member of its group is a candidate
                    p = nxt[e]
                    while is_call[p] and group_of[p] != g:
                        p = nxt[p]
                    if is_call[p]:
                        e = nxt[e]
                        continue
                i = node_op[e]
                new = step(state, i)
                if new is not _NO and not (g >= 0 and (new is state or new == state)):
                    f, z = fin | fbit[i], lz | lbit[i]
                    low = (f ^ (f + 1)).bit_length() - 1  # the leading ops all linearized
                    k = (low, f >> low, z, new)
                    if k not in memo and not (z and _dominated(exhausted.get((low, k[1], new)), z)):
                        memo.add(k)
                        if len(memo) > max_states:
                            return _Outcome(UNKNOWN, len(memo), reason=f"budget of {max_states:,} "
                                            f"states spent (deepest linearizable prefix: {max(best, 0)} of {n} ops)")
                        if f == all_fixed:
                            return _Outcome(OK, len(memo))  # only loose ops left: see above
                        stack.append((e, state, False, phase))
                        state, fin, lz, phase = new, f, z, 0
                        _lift(e, match[e], nxt, prv)
                        e = nxt[0]
                        fresh = True
                        continue
                e = nxt[e]
                continue
            if phase == 0 and has_lazy:
                phase, e = 1, nxt[0]  # the eager candidates are spent: now the lazy ones
                continue
            # The return of an op not linearized yet: the current prefix cannot be extended
            # past it. Remember the deepest such point for the explanation, then backtrack.
            if len(stack) > best:
                best = len(stack)
                out.prefix = [node_op[c] for c, _, _, _ in stack]
                out.stuck, out.state = node_op[e], state
                pend, p = [], nxt[0]
                while p != e:
                    if is_call[p]:
                        pend.append(node_op[p])
                    p = nxt[p]
                out.pending = pend  # the stuck op's own call is among them
        # Backtrack: undo the last move and try the next candidate after it. A forced move
        # had no alternatives, so its configuration is exhausted too: undo the one before.
        while True:
            if not stack:
                out.verdict, out.states = FAIL, len(memo)
                return out
            if has_loose:  # this configuration is exhausted: it dominates its loose supersets
                low = (fin ^ (fin + 1)).bit_length() - 1
                exhausted.setdefault((low, fin >> low, state), []).append(lz)
            e, state, forced, phase = stack.pop()
            i = node_op[e]
            fin ^= fbit[i]
            lz ^= lbit[i]
            _unlift(e, match[e], nxt, prv)
            if not forced:
                break
        e = nxt[e]
    return _Outcome(OK, len(memo))


def _lift(c: int, r: int, nxt: list[int], prv: list[int]) -> None:
    """Take a linearized op's call `c` and return `r` out of the event list."""
    nxt[prv[c]] = nxt[c]
    prv[nxt[c]] = prv[c]
    nxt[prv[r]] = nxt[r]
    prv[nxt[r]] = prv[r]


def _unlift(c: int, r: int, nxt: list[int], prv: list[int]) -> None:
    """Put them back: the return first, then the call, the reverse of `_lift`."""
    nxt[prv[r]] = r
    prv[nxt[r]] = r
    nxt[prv[c]] = c
    prv[nxt[c]] = c


def _dominated(exhausted_lz: list[int] | None, lz: int) -> bool:
    """Was a configuration with the same fixed ops and state, and a subset of `lz`'s loose
    ops, exhausted without success? Then this one fails too (see `_search`)."""
    return bool(exhausted_lz) and any(not (x & ~lz) for x in exhausted_lz)


def _groups(ops: Sequence[_Op]) -> list[int]:
    """For each op, its symmetry group (-1: none). Loose ops with the same effect on every
    model state share one: all deletes; puts of one value; cas ops with one expected value and
    one new value. A value no op can tell apart from any other written value (no get returned
    it, no cas expected it) is "a value nobody reads": puts of any such values share a group,
    since every model step (value and revision) treats them alike."""
    read = _read_values(ops)
    ids: dict[tuple, int] = {}
    out = []
    for o in ops:
        if o.known or o.ret != _INF:
            out.append(-1)
            continue
        op = o.op
        value = op.value if op.value in read else _UNREAD
        sig = (op.kind, op.expected if op.kind == CAS else None, None if op.kind == DELETE else value)
        out.append(ids.setdefault(sig, len(ids)))
    return out


# --------------------------------------------------------------------------- per key


def _prepare(ops: Sequence[Operation], initial: object, has_initial: bool,
             kr: KeyResult) -> tuple[list[_Op], list[_Op]]:
    """Reductions 1-3 of the module docstring: (first-pass ops, full ops)."""
    writers: Counter[object] = Counter(op.value for op in ops if op.kind in (PUT, CAS))
    if has_initial:
        writers[initial] += 1
    seen_by: dict[object, float] = {}  # value -> earliest return of a completed op that saw it
    for op in ops:
        if op.t_done is None:
            continue
        if op.kind == GET and op.output is not None:
            v = op.output
        elif op.kind == CAS and op.output is True and op.expected is not None:
            v = op.expected
        else:
            continue
        if op.t_done < seen_by.get(v, _INF):
            seen_by[v] = op.t_done
    first: list[_Op] = []
    full: list[_Op] = []
    for op in ops:
        if op.t_done is not None:
            o = _Op(op, op.t_done, op.output, True)
            first.append(o)
            full.append(o)
            continue
        kr.indeterminate += 1
        if op.kind == GET:
            kr.dropped_gets += 1
            continue
        if op.kind == DELETE:
            o = _Op(op, _INF, None, False)
            first.append(o)
            full.append(o)
            continue
        seen = seen_by.get(op.value)
        if seen is not None and writers[op.value] == 1 and seen >= op.t_invoke:
            kr.resolved += 1  # it is this op's value that was seen: it swapped, before `seen`
            o = _Op(op, seen, True, True)
            first.append(o)
            full.append(o)
            continue
        if seen is None:
            kr.unobserved += 1
            full.append(_Op(op, _INF, None, False, lazy=True))
        else:
            o = _Op(op, _INF, None, False)
            first.append(o)
            full.append(o)
    return first, full


def _run(model: Callable[..., _Step], init: object, first: list[_Op],
         full: list[_Op], kr: KeyResult, check: str, max_states: int,
         deadline: float | None) -> bool:
    """First pass, then the full one if the first did not succeed and left ops out. Records
    the verdict in `kr`; True when ok.

    The full pass also runs after a first pass that ran out of budget: a first pass often
    runs out because it is proving a failure that one of the left-out writes explains, and
    the full pass, placing that write, then finds a linearization quickly."""
    res = _search(first, model(first), init, max_states, deadline)
    kr.passes += 1
    kr.states += res.states
    if res.verdict == OK:
        return True
    kr.check, kr.verdict = check, res.verdict
    if res.verdict == FAIL:
        kr.explanation = _explain(kr.key, check, first, res, model, init)
    else:
        kr.reason = f"{check} check: {res.reason}"
    if len(first) == len(full) or res.reason == "timeout":
        return False
    first_failed = res.verdict == FAIL
    res = _search(full, model(full), init, max_states, deadline)
    kr.passes += 1
    kr.states += res.states
    if res.verdict == OK:
        kr.verdict, kr.explanation, kr.reason = OK, None, ""
        return True
    kr.verdict = res.verdict
    if res.verdict == FAIL:
        kr.explanation, kr.reason = _explain(kr.key, check, full, res, model, init), ""
    elif first_failed:
        # Keep the first pass's explanation: it is what a violation would look like.
        kr.reason = (f"{check} check: no linearization without the {kr.unobserved} indeterminate "
                     f"writes nobody observed (explained below); with them, {res.reason}")
    else:
        kr.reason = (f"{check} check: {res.reason}, both without and with the {kr.unobserved} "
                     f"indeterminate writes nobody observed")
    return False


def _explain(key: Hashable, check: str, ops: Sequence[_Op], res: _Outcome,
             model: Callable[..., _Step], init: object) -> Explanation:
    stuck = ops[res.stuck].op
    # The search's state holds `_UNREAD` for values nobody read; replay the prefix with the
    # real values so the report says which one the register held.
    step, state = model(ops, canonical=False), init
    for i in res.prefix:
        state = step(state, i)
    state_text = _show_state(state)
    reason = (f"{stuck.client} {stuck.kind} returned at {stuck.t_done:.3f} but no order of the "
              f"ops before it gives its output" if stuck.t_done is not None else
              f"{stuck.client} {stuck.kind} could not be placed")
    tail = res.prefix[-EXPLAIN_PREFIX:]
    return Explanation(key, check, len(res.prefix), tuple(ops[i].op for i in tail), state_text,
                       stuck, tuple(ops[i].op for i in res.pending), reason)


def _unwritten_read(ops: Sequence[Operation], initial: object) -> Explanation | None:
    """A completed op that saw a value no op on the key writes (a get returning it, a cas
    expecting it that swapped): no order of any ops produces it, so the key fails without a
    search. Cheap, and the clearest report of a corrupt or misrouted read."""
    written = {op.value for op in ops if op.kind in (PUT, CAS)} | {initial}
    for op in ops:
        if op.t_done is None:
            continue
        seen = (op.output if op.kind == GET else
                op.expected if op.kind == CAS and op.output is True else None)
        if seen is not None and seen not in written:
            what = "returned" if op.kind == GET else "swapped from"
            return Explanation(op.key, "value", 0, (), "(not searched)", op, (op,),
                               f"{op.client} {op.kind} {what} {show(seen)}, which no op on this "
                               f"key writes: it was never written to this key")
    return None


def check_key(key: Hashable, ops: Sequence[Operation], *, initial: Hashable | None = None,
              revisions: bool = True, max_states: int = DEFAULT_MAX_STATES,
              deadline: float | None = None) -> KeyResult:
    """One key's sub-history against the register model (then the revision model).
    `initial` is the key's value before the history (None: absent)."""
    t0 = time.monotonic()
    kr = KeyResult(key, OK, ops=len(ops))
    first, full = _prepare(ops, initial, initial is not None, kr)
    ghost = _unwritten_read(ops, initial)
    if ghost is not None:
        kr.verdict, kr.explanation = FAIL, ghost
        kr.seconds = time.monotonic() - t0
        return kr
    ok = _run(_register, initial, first, full, kr, "value", max_states, deadline)
    if ok and revisions and any(op.revision is not None for op in ops):
        # A revision reported by a read (a get, a failed cas) that no recorded mutation
        # returned belongs to an indeterminate write: that write was observed after all, by
        # its revision, so a first pass without the unobserved writes would fail for nothing.
        mutated = {op.revision for op in ops if op.mutated}
        orphan = any(op.revision not in mutated for op in ops if op.t_done is not None
                     and op.revision and (op.kind == GET or (op.kind == CAS and op.output is False)))
        _run(_with_revisions, (initial, None if initial is not None else 0, 0),
             full if orphan else first, full, kr, "revisions", max_states, deadline)
    kr.seconds = time.monotonic() - t0
    return kr


# --------------------------------------------------------------------------- store-wide


def revision_violations(ops: Iterable[Operation]) -> list[str]:
    """The store-wide revision checks (module docstring, "Revisions"), one line each: a revision
    returned by two successful mutations, and a successful mutation invoked after another had
    completed that got a revision no higher than it. O(n log n), no search."""
    muts = [op for op in ops if op.revision is not None and op.mutated]
    lines: list[str] = []
    count = 0

    def add(text: str) -> None:
        nonlocal count
        count += 1
        if count <= MAX_LISTED:
            lines.append(text)

    by_rev: dict[int, Operation] = {}
    for op in muts:
        assert op.revision is not None
        other = by_rev.setdefault(op.revision, op)
        if other is not op:
            add(f"revision {op.revision} returned by two mutations: {other.line()} and {op.line()}")
    done = sorted(muts, key=lambda o: o.t_done or 0.0)
    j = 0
    top: Operation | None = None  # the highest-revision mutation completed so far
    for op in sorted(muts, key=lambda o: o.t_invoke):
        while j < len(done) and (done[j].t_done or 0.0) < op.t_invoke:
            if top is None or (done[j].revision or 0) > (top.revision or 0):
                top = done[j]
            j += 1
        if top is not None and (op.revision or 0) <= (top.revision or 0):
            add(f"{op.line()} was invoked after {top.line()} completed, yet has a revision no "
                f"higher")
    if count > MAX_LISTED:
        lines.append(f"... and {count - MAX_LISTED} more")
    return lines


def check_history(ops: Iterable[Operation], *, initial: Mapping[Hashable, Hashable] | None = None,
                  revisions: bool = True, max_states: int = DEFAULT_MAX_STATES,
                  timeout: float | None = None) -> Result:
    """Is the history linearizable for a map of registers? Every key is checked (a failure on
    one does not hide another's); `max_states` is per key and `timeout` (seconds) for the
    whole call. `initial` gives keys a value before the history (default: every key absent).
    `revisions=False` skips both revision checks."""
    t0 = time.monotonic()
    deadline = None if timeout is None else t0 + timeout
    per_key: dict[Hashable, list[Operation]] = defaultdict(list)
    all_ops: list[Operation] = []
    for op in ops:
        per_key[op.key].append(op)
        all_ops.append(op)
    init = initial or {}
    result = Result()
    for key, kops in per_key.items():
        result.keys[key] = check_key(key, kops, initial=init.get(key), revisions=revisions,
                                     max_states=max_states, deadline=deadline)
    if revisions:
        result.revision_violations = revision_violations(all_ops)
    result.seconds = time.monotonic() - t0
    return result


def render(ops: Iterable[Operation]) -> list[str]:
    """The ops one per line, by invocation time (for a report or a failing test's message)."""
    return [op.line() for op in sorted(ops, key=lambda o: o.t_invoke)]
