"""The KV linearizability checker (tools/chaos/linearizability.py): crafted histories with a
known verdict, histories generated from a real sequential execution (always linearizable),
the same with one read made impossible (never), and a budget check on a chaos-sized history.

Times in the crafted histories are small integers so each interval can be read off the test;
`[a, b]` in a comment is an op's invocation and completion."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.chaos.linearizability import (
    FAIL,
    OK,
    UNKNOWN,
    Operation,
    check_history,
    render,
    revision_violations,
)

put, get, cas, delete = Operation.put, Operation.get, Operation.cas, Operation.delete


def _verdict(ops, **kw):
    return check_history(ops, **kw).verdict


# --------------------------------------------------------------------------- crafted: not ok


def test_a_stale_read_after_a_completed_write_is_found_and_explained():
    h = [put("c1", "x", b"1", 0, 1),   # [0, 1]
         put("c2", "x", b"2", 2, 3),   # [2, 3] completed before the read began
         get("c3", "x", b"1", 4, 5)]   # [4, 5] still sees 1
    r = check_history(h)
    assert r.verdict == FAIL and not r.ok and r.key == "x"
    ex = r.explanation
    assert ex is not None and ex.stuck is h[2]
    assert ex.prefix_length == 2 and ex.prefix_tail == (h[0], h[1])
    assert ex.state == "b'2'"  # what the register held where the read could not be placed


def test_a_read_of_a_value_never_written_is_found_without_a_search_and_says_so():
    h = [put("c1", "x", b"1", 0, 1), get("c2", "x", b"ghost", 0.5, 2)]
    r = check_history(h)
    assert r.verdict == FAIL and r.keys["x"].states == 0
    assert "never written" in r.explanation.reason and r.explanation.stuck is h[1]
    # A cas that swapped from a value nobody wrote is the same impossibility.
    assert _verdict([cas("c1", "x", b"ghost", b"2", True, 0, 1)]) == FAIL


def test_two_cas_from_the_same_expected_value_cannot_both_swap():
    h = [put("c1", "x", b"a", 0, 1),
         cas("c2", "x", b"a", b"b", True, 2, 5),   # concurrent with each other:
         cas("c3", "x", b"a", b"c", True, 2, 5)]   # whichever goes second sees b or c, not a
    assert _verdict(h) == FAIL
    h[2] = replace(h[2], output=False)
    assert _verdict(h) == OK


def test_a_lost_write_is_found():
    h = [put("c1", "x", b"1", 0, 1),
         get("c2", "x", None, 2, 3)]  # an acknowledged write, then the key reads absent
    assert _verdict(h) == FAIL


def test_a_read_going_back_in_time_between_two_readers_is_found():
    # The write is slow ([0, 10]) so each read alone is fine; but c2 saw the new value and
    # completed before c3 began, and c3 saw the old one.
    h = [put("c1", "x", b"new", 0, 10),
         get("c2", "x", b"new", 1, 2),
         get("c3", "x", None, 3, 4)]
    assert _verdict(h) == FAIL
    assert _verdict(h[:2]) == OK and _verdict([h[0], h[2]]) == OK


def test_a_delete_that_found_an_absent_key_is_found():
    assert _verdict([delete("c1", "x", 0, 1, found=True)]) == FAIL
    assert _verdict([delete("c1", "x", 0, 1, found=False)]) == OK
    assert _verdict([put("c1", "x", b"1", 0, 1), delete("c1", "x", 2, 3, found=False)]) == FAIL


# --------------------------------------------------------------------------- crafted: ok


def test_concurrent_ops_are_ok_in_an_order_other_than_their_invocation_order():
    h = [put("c1", "x", b"1", 0, 10),   # invoked first, linearized last
         put("c2", "x", b"2", 1, 2),
         get("c3", "x", b"2", 3, 4),
         get("c4", "x", b"1", 5, 11)]
    assert _verdict(h) == OK
    # ...but once c4 has seen 1, a later read of 2 is stale.
    assert _verdict(h + [get("c5", "x", b"2", 12, 13)]) == FAIL


def test_ops_that_touch_at_one_instant_count_as_concurrent():
    # get returned at 1.0, the put was invoked at 1.0: a coarse clock must not invent a
    # violation, so the read may be ordered after the write.
    h = [put("c1", "x", b"1", 1.0, 2.0), get("c2", "x", b"1", 0.0, 1.0)]
    assert _verdict(h) == OK
    assert _verdict([h[0], replace(h[1], t_done=0.999)]) == FAIL


def test_initial_values_are_the_registers_before_the_history():
    h = [get("c1", "x", b"seed", 0, 1)]
    assert _verdict(h) == FAIL
    assert _verdict(h, initial={"x": b"seed"}) == OK


# --------------------------------------------------------------------------- indeterminate


def test_an_indeterminate_put_whose_value_appears_later_is_ok_and_resolved():
    h = [put("c1", "x", b"1", 0, None),   # the client never heard back
         get("c2", "x", b"1", 5, 6)]
    r = check_history(h)
    assert r.verdict == OK
    k = r.keys["x"]
    assert k.indeterminate == 1 and k.resolved == 1 and k.passes == 1


def test_an_indeterminate_put_whose_value_never_appears_is_ok():
    h = [put("c1", "x", b"1", 0, 1),
         put("c2", "x", b"lost?", 2, None),
         get("c3", "x", b"1", 5, 6),
         get("c3", "x", b"1", 7, 8)]
    r = check_history(h)
    assert r.verdict == OK and r.keys["x"].unobserved == 1


def test_an_indeterminate_put_cannot_be_placed_before_its_invocation():
    h = [get("c1", "x", b"1", 0, 1),        # sees 1 ...
         put("c2", "x", b"1", 2, None)]     # ... which only this later put writes
    r = check_history(h)
    assert r.verdict == FAIL and r.keys["x"].resolved == 0
    assert r.explanation.stuck is h[0]


def test_an_unobserved_indeterminate_write_is_still_used_when_a_later_op_needs_it():
    # Nobody reads "z", so the first pass leaves the put out and fails (cas(a -> b) would have
    # swapped); the full pass places the put before the cas and finds the history ok.
    h = [put("c1", "x", b"a", 0, 1),
         put("c2", "x", b"z", 2, None),
         cas("c3", "x", b"a", b"b", False, 3, 4),
         put("c4", "x", b"c", 5, 6),
         get("c1", "x", b"c", 7, 8)]
    r = check_history(h)
    assert r.verdict == OK and r.keys["x"].passes == 2
    assert _verdict([op for op in h if op.t_done is not None]) == FAIL


def test_two_unobserved_writes_each_needed_in_its_own_place():
    # Both failed cas need the key to hold something other than what they expect. Only the
    # indeterminate cas can act while the key holds a, and only the indeterminate put after
    # c: using the put for the first failure (tried first: invoked first) strands the second.
    # Having given that up must not rule out the other assignment, which has the same
    # state and the same completed ops.
    h = [put("c0", "x", b"a", 0, 1),
         put("w1", "x", b"u2", 2.0, None),
         cas("w2", "x", b"a", b"u1", None, 2.1, None),
         cas("c1", "x", b"a", b"b", False, 3, 4),
         put("c2", "x", b"c", 5, 6),
         cas("c3", "x", b"c", b"d", False, 7, 8)]
    r = check_history(h)
    assert r.verdict == OK and r.keys["x"].passes == 2
    assert _verdict(h[:2] + h[3:]) == FAIL and _verdict([h[0]] + h[2:]) == FAIL


def test_an_indeterminate_cas_may_or_may_not_have_swapped():
    base = [put("c1", "x", b"a", 0, 1), cas("c2", "x", b"a", b"b", None, 2, None)]
    assert _verdict(base + [get("c3", "x", b"b", 5, 6)]) == OK
    assert _verdict(base + [get("c3", "x", b"a", 5, 6)]) == OK
    # Once it is seen to have swapped, it cannot be un-done.
    assert _verdict(base + [get("c3", "x", b"b", 5, 6), get("c3", "x", b"a", 7, 8)]) == FAIL


def test_an_indeterminate_get_is_ignored():
    h = [put("c1", "x", b"1", 0, 1), get("c2", "x", b"nonsense", 2, None)]
    r = check_history(h)
    assert r.verdict == OK and r.keys["x"].dropped_gets == 1


# --------------------------------------------------------------------------- keys, revisions


def test_each_key_is_checked_on_its_own_and_every_failing_key_is_reported():
    h = [put("c1", "a", b"1", 0, 1), get("c2", "a", b"1", 2, 3),
         put("c1", "b", b"1", 0, 1), get("c2", "b", None, 2, 3),
         put("c1", "c", b"1", 0, 1), get("c2", "c", b"2", 2, 3)]
    r = check_history(h)
    assert r.verdict == FAIL and r.key == "b"
    assert [k.key for k in r.failed] == ["b", "c"]
    assert r.keys["a"].verdict == OK and r.stats()["keys"] == 3


def test_a_get_with_a_stale_revision_fails_the_revision_check_only():
    h = [put("c1", "x", b"1", 0, 1, revision=3),
         put("c2", "x", b"1", 2, 3, revision=7),   # the same value written again
         get("c3", "x", b"1", 4, 5, revision=3)]   # but reported at the older revision
    r = check_history(h)
    assert r.verdict == FAIL and r.failed[0].check == "revisions"
    assert r.explanation.check == "revisions" and r.explanation.stuck is h[2]
    assert check_history(h, revisions=False).verdict == OK
    assert _verdict(h[:2] + [replace(h[2], revision=7)]) == OK


def test_revisions_of_one_key_must_increase_in_linearization_order():
    # put 1 is still running when put 2 starts, so the store-wide real-time check cannot see
    # it; but the read of 1 before put 2 began places put 1 first: revisions 9, then 5.
    h = [put("c1", "x", b"1", 0, 10, revision=9),
         get("c3", "x", b"1", 0.5, 0.8, revision=9),
         put("c2", "x", b"2", 1, 2, revision=5),
         get("c3", "x", b"2", 3, 4, revision=5)]
    assert revision_violations(h) == []
    assert _verdict(h, revisions=False) == OK
    assert _verdict(h) == FAIL
    assert _verdict([h[0], h[2], h[3]]) == OK  # without the early read put 1 may come last


def test_a_delete_takes_a_revision_above_the_write_it_removed():
    h = [put("c1", "x", b"1", 0, 10, revision=9),
         get("c2", "x", b"1", 0.5, 0.8, revision=9),   # the put came first ...
         delete("c3", "x", 1, 2, found=True, revision=5),  # ... so this delete's 5 is too low
         get("c2", "x", None, 3, 4)]
    assert revision_violations(h) == [] and _verdict(h, revisions=False) == OK
    assert _verdict(h) == FAIL
    assert _verdict(h[:2] + [replace(h[2], revision=12), h[3]]) == OK


def test_a_failed_cas_reports_the_keys_mod_revision():
    h = [put("c1", "x", b"1", 0, 1, revision=4),
         cas("c2", "x", b"0", b"2", False, 2, 3, revision=4)]
    assert _verdict(h) == OK
    assert _verdict([h[0], replace(h[1], revision=3)]) == FAIL
    assert _verdict([cas("c2", "x", b"0", b"2", False, 2, 3, revision=0)]) == OK  # absent: 0


def test_an_indeterminate_writes_revision_is_pinned_by_its_first_observer():
    h = [put("c1", "x", b"1", 0, 1, revision=4),
         put("c2", "x", b"2", 2, None),
         get("c3", "x", b"2", 5, 6, revision=8),
         get("c3", "x", b"2", 7, 9, revision=8)]
    assert _verdict(h) == OK
    assert _verdict(h[:3] + [replace(h[3], revision=9)]) == FAIL   # pinned at 8 by the first
    assert _verdict(h[:2] + [replace(h[2], revision=3)]) == FAIL   # below the earlier put's 4


def test_store_wide_revisions_are_unique_and_follow_real_time():
    dup = [put("c1", "a", b"1", 0, 1, revision=5), put("c2", "b", b"1", 0, 1, revision=5)]
    assert any("returned by two mutations" in v for v in revision_violations(dup))
    assert _verdict(dup) == FAIL
    back = [put("c1", "a", b"1", 0, 1, revision=6), put("c2", "b", b"1", 2, 3, revision=5)]
    lines = revision_violations(back)
    assert len(lines) == 1 and "no higher" in lines[0]
    assert check_history(back).revision_violations == lines
    concurrent = [put("c1", "a", b"1", 0, 2, revision=6), put("c2", "b", b"1", 1, 3, revision=5)]
    assert revision_violations(concurrent) == [] and _verdict(concurrent) == OK


# --------------------------------------------------------------------------- budget, report


def test_the_memo_turns_orders_of_concurrent_ops_into_sets_of_them():
    # 12 concurrent puts, then a read of absent: impossible, and proving it by trying every
    # order would take 12! (479 million) orders. The memo keeps (set linearized, value): at
    # most 2**12 * 13 states.
    h = [put(f"c{i}", "x", i, 0, 10) for i in range(12)] + [get("r", "x", None, 11, 12)]
    r = check_history(h, timeout=20.0)
    assert r.verdict == FAIL
    assert r.keys["x"].states <= 2**12 * 13


def test_concurrent_reads_of_one_value_are_not_tried_in_every_order():
    # 20 reads of "a" run alongside put(b), then a read of absent nobody can explain. Proving
    # that means trying everything; read in every subset that is 2**20 states, with reads
    # forced (a matching read is placed at once, alternatives untried) a few hundred.
    h = ([put("c0", "x", b"a", 0, 1), put("c1", "x", b"b", 2, 10)]
         + [get(f"r{i}", "x", b"a", 2, 10) for i in range(20)]
         + [get("z", "x", None, 11, 12)])
    r = check_history(h, max_states=20_000)
    assert r.verdict == FAIL and r.keys["x"].states < 2_000


def test_indeterminate_ops_with_the_same_effect_are_tried_as_one():
    # 16 deletes that never returned, and a stale read: every placement of every subset of the
    # deletes fails. They have the same effect, so only "how many" matters, not "which".
    h = ([put("c0", "x", b"a", 0, 1)]
         + [delete(f"d{i}", "x", 2 + i / 100, None) for i in range(16)]
         + [put("c1", "x", b"b", 3, 4), get("c2", "x", b"a", 5, 6)])
    r = check_history(h, max_states=20_000)
    assert r.verdict == FAIL and r.keys["x"].states < 2_000


def test_a_spent_budget_is_unknown_never_ok():
    ops = _simulate(random.Random(1), n_ops=200, keys=["x"], clients=6)
    r = check_history(ops, max_states=5)
    assert r.verdict == UNKNOWN and not r.ok and r.key is None
    k = r.keys["x"]
    assert "budget of 5 states" in k.reason and k.states <= k.passes * 6  # per search
    assert check_history(ops).verdict == OK


def test_a_timeout_is_unknown_never_ok():
    ops = _simulate(random.Random(2), n_ops=3000, keys=["x"], clients=6)
    r = check_history(ops, timeout=0.0)
    assert r.verdict == UNKNOWN and r.keys["x"].reason.endswith("timeout")


def test_the_report_is_one_line_per_op_in_the_documented_shape():
    h = [put("c1", b"k", b"v", 0, 1.25, revision=3), get("c2", b"k", b"w", 1.5, 2)]
    assert render(h) == ["[0.000, 1.250] c1 put(b'k', b'v') -> ok @3",
                         "[1.500, 2.000] c2 get(b'k') -> b'w'"]
    assert cas("c3", b"k", None, b"v", None, 3, None).line() == \
        "[3.000, ...   ] c3 cas(b'k', absent -> b'v') -> ? (indeterminate)"
    lines = check_history(h).lines()
    assert lines[0].startswith("linearizability: not-linearizable: 1 key, 2 ops")
    assert any(line.startswith("  could not be placed: [1.500, 2.000] c2 get") for line in lines)


@pytest.mark.parametrize("bad", [
    dict(kind="scan"),
    dict(t_done=-1.0),
    dict(kind="cas", value=b"v", output=None),
    dict(kind="put", value=None),
    dict(kind="delete", output="yes"),
])
def test_a_malformed_record_is_refused_where_it_is_made(bad):
    fields = dict(client="c", kind="get", key="x", t_invoke=0.0, t_done=1.0) | bad
    with pytest.raises(ValueError):
        Operation(**fields)


# --------------------------------------------------------------------------- generated


def _simulate(rng: random.Random, n_ops: int, keys: list, clients: int, p_indeterminate=0.02,
              values: list | None = None) -> list[Operation]:
    """A history of `clients` clients, each running one op at a time, each op taking effect at
    a random instant inside its interval, the outputs computed by running the ops in the order
    of those instants against a real map with log-index revisions. Linearizable by
    construction. An indeterminate op took effect or not (even odds) and is recorded with no
    completion. Values are unique per write unless `values` gives a pool to draw from."""
    cursor = [rng.uniform(0, 0.2) for _ in range(clients)]
    last_seen: dict[tuple[int, object], object] = {}
    planned = []
    for seq in range(n_ops):
        c = min(range(clients), key=cursor.__getitem__)  # the client free earliest
        inv = cursor[c]
        ret = inv + rng.uniform(0.01, 0.5)
        cursor[c] = ret + rng.uniform(0.0, 0.05)
        key = rng.choice(keys)
        kind = rng.choices(["get", "put", "cas", "delete"], [45, 30, 20, 5])[0]
        value = rng.choice(values) if values else f"c{c}.{seq}".encode()
        expected = last_seen.get((c, key)) if rng.random() < 0.7 else rng.choice(
            [None, *(values or [])])
        indet = rng.random() < p_indeterminate
        applied = not indet or rng.random() < 0.5
        planned.append((rng.uniform(inv, ret), c, kind, key, value, expected, inv, ret, indet,
                        applied))
    store: dict = {}   # key -> (value, mod_revision)
    index = 0          # every command takes a log index; a mutation's revision is its index
    ops: list[Operation] = []
    for _, c, kind, key, value, expected, inv, ret, indet, applied in sorted(planned):
        cur, mod = store.get(key, (None, 0))
        done = None if indet else ret
        client = f"c{c}"
        if kind == "get":
            ops.append(get(client, key, cur, inv, done, revision=mod if cur is not None else None))
            last_seen[(c, key)] = cur
            continue
        if not applied:  # never reached the log
            swapped = cur == expected if kind == "cas" else None
            ops.append(Operation(client, kind, key, inv, None, value=None if kind == "delete" else value,
                                 expected=expected, output=swapped))
            continue
        index += 1
        if kind == "put":
            store[key] = (value, index)
            ops.append(put(client, key, value, inv, done, revision=None if indet else index))
        elif kind == "cas":
            ok = cur == expected
            if ok:
                store[key] = (value, index)
            rev = index if ok else mod
            ops.append(cas(client, key, expected, value, ok if not indet else None, inv, done,
                           revision=None if indet else rev))
        else:
            found = cur is not None
            store.pop(key, None)
            ops.append(delete(client, key, inv, done, found=None if indet else found,
                              revision=None if indet or not found else index))
    return ops


_HYP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_HYP
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(1, 60), clients=st.integers(1, 6),
       pool=st.booleans(), p_indet=st.sampled_from([0.0, 0.1, 0.3]))
def test_a_history_from_a_real_execution_is_always_linearizable(seed, n_ops, clients, pool, p_indet):
    values = [b"a", b"b", b"c"] if pool else None  # a small pool: ABA, repeated writes
    ops = _simulate(random.Random(seed), n_ops, ["x", "y"], clients, p_indet, values)
    r = check_history(ops, max_states=200_000)
    assert r.verdict == OK, "\n".join(r.lines() + render(ops))


def _make_stale(ops: list[Operation], rng: random.Random) -> tuple[list[Operation], int] | None:
    """One completed get changed to return a value it provably cannot see: the value u of a
    completed put P_u, overwritten by a completed put P_w invoked after P_u completed, which
    itself completed before the get was invoked. Every order has P_u, then P_w, then the get,
    and (values being unique) nothing writes u again: a stale read. Returns the new history
    and the get's position, or None when no get has such a pair of puts before it."""
    gets = [i for i, op in enumerate(ops) if op.kind == "get" and op.t_done is not None]
    rng.shuffle(gets)
    for i in gets[:50]:
        g = ops[i]
        before = [op for op in ops if op.kind == "put" and op.key == g.key
                  and op.t_done is not None and op.t_done < g.t_invoke]
        for w in sorted(before, key=lambda op: -op.t_done)[:5]:
            older = [op for op in before if op.t_done < w.t_invoke and op.value != g.output]
            if older:
                u = rng.choice(older)
                return ops[:i] + [replace(g, output=u.value, revision=u.revision)] + ops[i + 1:], i
    return None


@_HYP
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(2, 80), clients=st.integers(1, 6),
       p_indet=st.sampled_from([0.0, 0.1, 0.3]))
def test_one_provably_stale_read_makes_a_real_history_fail(seed, n_ops, clients, p_indet):
    rng = random.Random(seed)
    ops = _simulate(rng, n_ops, ["x", "y"], clients, p_indet)  # unique values
    made = _make_stale(ops, rng)
    if made is None:
        return
    bad, i = made
    r = check_history(bad, max_states=200_000)
    assert r.verdict == FAIL and r.key == bad[i].key, "\n".join(r.lines() + render(bad))
    assert r.failed[0].states > 0  # found by the search, not by the unwritten-value check


@_HYP
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(2, 60), clients=st.integers(1, 6),
       pool=st.booleans(), which=st.integers(0, 10**6))
def test_one_read_of_a_value_never_written_makes_a_real_history_fail(seed, n_ops, clients, pool, which):
    values = [b"a", b"b", b"c"] if pool else None
    ops = _simulate(random.Random(seed), n_ops, ["x", "y"], clients, 0.1, values)
    reads = [i for i, op in enumerate(ops) if op.kind == "get" and op.t_done is not None]
    if not reads:
        return
    i = reads[which % len(reads)]
    ops[i] = replace(ops[i], output=b"never-written")  # no op and no initial value writes it
    r = check_history(ops, max_states=200_000)
    assert r.verdict == FAIL and r.key == ops[i].key, "\n".join(r.lines())
    assert "never written" in r.explanation.reason


def _brute_force(ops: list[Operation]) -> bool:
    """Linearizable? By trying every order, with none of the checker's machinery: an op may go
    next once every op that completed before its invocation is placed; completed ops must all
    be placed, indeterminate ones may be left out (= took effect last, or never)."""
    n = len(ops)

    def step(state, op):
        known = op.t_done is not None
        if op.kind == "get":
            return state if (not known or op.output == state) else _NO_WAY
        if op.kind == "put":
            return op.value
        if op.kind == "cas":
            swaps = state == op.expected
            if known and op.output != swaps:
                return _NO_WAY
            return op.value if swaps else state
        if known and op.output is not None and op.output != (state is not None):
            return _NO_WAY
        return None

    def go(placed: frozenset, state) -> bool:
        if all(i in placed or ops[i].t_done is None for i in range(n)):
            return True
        for i in range(n):
            if i in placed:
                continue
            if any(j not in placed and ops[j].t_done is not None and ops[j].t_done < ops[i].t_invoke
                   for j in range(n)):
                continue
            new = step(state, ops[i])
            if new is not _NO_WAY and go(placed | {i}, new):
                return True
        return False

    return go(frozenset(), None)


_NO_WAY = object()
_VALUES = [b"a", b"b"]


@st.composite
def _small_history(draw):
    ops = []
    for i in range(draw(st.integers(1, 7))):
        t0 = draw(st.integers(0, 6))
        done = draw(st.one_of(st.none(), st.integers(t0, 8)))
        kind = draw(st.sampled_from(["get", "put", "cas", "delete"]))
        v = draw(st.sampled_from(_VALUES))
        if kind == "get":
            ops.append(get(f"c{i}", "x", draw(st.sampled_from([None, *_VALUES])), t0, done))
        elif kind == "put":
            ops.append(put(f"c{i}", "x", v, t0, done))
        elif kind == "cas":
            ops.append(cas(f"c{i}", "x", draw(st.sampled_from([None, *_VALUES])), v,
                           draw(st.booleans()) if done is not None else None, t0, done))
        else:
            ops.append(delete(f"c{i}", "x", t0, done, found=draw(st.sampled_from([None, True, False]))))
    return ops


@settings(max_examples=600, deadline=None)
@given(_small_history())
def test_the_checker_agrees_with_brute_force_on_small_histories(ops):
    # Integer times tie often (the touching-intervals rule); two values make ABA common; random
    # outputs make about half the histories non-linearizable.
    assert (check_history(ops, revisions=False).verdict == OK) == _brute_force(ops), \
        "\n".join(render(ops))


def test_a_chaos_sized_history_is_checked_within_budget():
    """2,000 ops on 5 keys, 8 clients (concurrency 8), 2 % indeterminate. Measured well under
    a second on the 2-core development machine; 30 s is a budget, not a benchmark."""
    ops = _simulate(random.Random(11), n_ops=2000, keys=[f"k{i}" for i in range(5)], clients=8)
    t0 = time.monotonic()
    r = check_history(ops)
    elapsed = time.monotonic() - t0
    assert r.verdict == OK, "\n".join(r.lines())
    assert r.stats()["ops"] == 2000 and r.stats()["indeterminate"] > 0
    assert elapsed < 30.0
    # The same history with one provably stale read fails, by search, as fast.
    bad, i = _make_stale(ops, random.Random(3))
    t0 = time.monotonic()
    r = check_history(bad)
    assert r.verdict == FAIL and r.key == bad[i].key and r.failed[0].states > 0
    assert time.monotonic() - t0 < 30.0
