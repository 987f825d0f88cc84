"""The watcher's replay (ipc/kv_watch.py WatchedState) against the real state machine
(node/statemachine/kv.py): over random command streams, the watcher reports a change exactly
where the state machine's result says OK, with the state machine's own record, for the watched
keys only."""

from __future__ import annotations

import random

import pytest

from ipc import kv_format as K
from ipc.kv_watch import KeyFilter, WatchedState
from node.statemachine.api import CommittedEntry
from node.statemachine.kv import KVStateMachine

KEYS = [b"a", b"a1", b"a2", b"b", b"ab"]


def random_command(rng: random.Random, sm: KVStateMachine) -> bytes:
    key = rng.choice(KEYS)
    r = rng.random()
    if r < 0.35:
        return K.encode_put(key, b"v%d" % rng.randrange(4))
    if r < 0.55:
        return K.encode_delete(key)
    if r < 0.7:
        return K.encode_cas(key, None if rng.random() < 0.3 else b"v%d" % rng.randrange(4), b"c%d" % rng.randrange(4))
    if r < 0.85:
        cur = sm.get(key)
        rev = cur.mod_revision if cur is not None and rng.random() < 0.6 else rng.randrange(1, 50)
        return K.encode_cas_revision(key, rev, b"r%d" % rng.randrange(4))
    return b"\x7fjunk"  # an entry the state machine refuses: changes nothing


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("key,prefix", [(b"a", True), (b"a", False), (b"", True)])
def test_the_watcher_sees_exactly_the_changes_the_state_machine_makes(seed: int, key: bytes, prefix: bool) -> None:
    rng = random.Random(seed)
    sm = KVStateMachine()
    match = KeyFilter(key, prefix)
    watched = WatchedState(match)
    for index in range(1, 300):
        body = random_command(rng, sm)
        before = {k: sm.get(k) for k in KEYS}
        (result,) = sm.apply([CommittedEntry(index, 1, body)])
        status = K.decode_result(result).status
        change = watched.apply(index, body)
        cmd = K.decode_command(body)
        touched = None if isinstance(cmd, K.Invalid) else cmd.key
        if touched is None or not match(touched) or status != K.Status.OK:
            assert change is None, (index, body, status)
            continue
        kind, k, old, new = change
        assert k == touched
        after = sm.get(k)
        assert kind == ("DELETE" if after is None else "PUT")
        assert (None if new is None else K.KeyValue(k, *new)) == after
        assert (None if old is None else K.KeyValue(k, *old)) == before[k]
    assert {k: K.KeyValue(k, *r) for k, r in watched.records.items()} == \
        {k: sm.get(k) for k in KEYS if match(k) and sm.get(k) is not None}
