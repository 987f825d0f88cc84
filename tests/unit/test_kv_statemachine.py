"""The KV state machine (node/statemachine/kv.py; docs/statemachine.md "The KV state machine"):
command semantics and revisions, refusals that change nothing, reads, and the snapshot invariant —
restoring a snapshot and applying the rest equals applying everything."""

from __future__ import annotations

import io
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from node.statemachine.api import CommittedEntry, StateMachineError
from node.statemachine.kv import (
    MAX_KEY_SIZE,
    MAX_SCAN_LIMIT,
    MAX_VALUE_SIZE,
    SNAPSHOT_END,
    Cas,
    Delete,
    Expect,
    Invalid,
    KeyValue,
    KVInputError,
    KVResult,
    KVStateMachine,
    Op,
    Put,
    SnapshotFormatError,
    Status,
    decode_command,
    decode_query_reply,
    decode_result,
    encode_cas,
    encode_cas_revision,
    encode_delete,
    encode_get,
    encode_put,
    encode_query_reply,
    encode_result,
    encode_scan,
)


class Log:
    """Applies bodies one entry at a time at increasing indices; keeps the decoded results."""

    def __init__(self, kv: KVStateMachine | None = None, index: int = 0) -> None:
        self.kv = kv or KVStateMachine()
        self.index = index

    def __call__(self, body: bytes, gap: int = 1) -> KVResult:
        self.index += gap
        (r,) = self.kv.apply([CommittedEntry(self.index, 1, body)])
        return decode_result(r)


def snap(kv: KVStateMachine) -> bytes:
    buf = io.BytesIO()
    kv.snapshot(buf)
    return buf.getvalue()


def restored(data: bytes) -> KVStateMachine:
    kv = KVStateMachine()
    kv.restore(io.BytesIO(data))
    return kv


# --------------------------------------------------------------------------- semantics


def test_put_get_and_revisions_follow_the_log_index():
    log = Log()
    assert log(encode_put(b"k", b"v1")) == KVResult(Status.OK, 1)
    assert log(encode_put(b"other", b"x"), gap=3) == KVResult(Status.OK, 4)  # a NOOP at 2, 3
    assert log(encode_put(b"k", b"v2")) == KVResult(Status.OK, 5)
    assert log.kv.get(b"k") == KeyValue(b"k", b"v2", create_revision=1, mod_revision=5, version=2)
    assert log.kv.get(b"k").revision == 5
    assert log.kv.get(b"nope") is None
    assert (log.kv.revision, log.kv.last_index, len(log.kv)) == (5, 5, 2)
    assert log(encode_put(b"empty", b"")).changed and log.kv.get(b"empty").value == b""


def test_delete_forgets_the_key_and_a_later_put_starts_a_new_life():
    log = Log()
    log(encode_put(b"k", b"v"))
    log(encode_put(b"k", b"w"))
    assert log(encode_delete(b"k")) == KVResult(Status.OK, 3)
    assert log.kv.get(b"k") is None
    r = log(encode_delete(b"k"))
    assert r == KVResult(Status.NOT_FOUND, 3) and r.ok and not r.changed  # the store's revision
    assert log.kv.revision == 3 and log.kv.last_index == 4
    log(encode_put(b"k", b"again"))
    assert log.kv.get(b"k") == KeyValue(b"k", b"again", 5, 5, 1)


def test_cas_by_value_by_absence_and_by_revision():
    log = Log()
    assert log(encode_cas(b"k", None, b"first")) == KVResult(Status.OK, 1)  # create if absent
    assert log(encode_cas(b"k", None, b"again")) == KVResult(Status.CAS_FAILED, 1)
    assert log(encode_cas(b"k", b"wrong", b"x")) == KVResult(Status.CAS_FAILED, 1)
    assert log(encode_cas(b"k", b"first", b"second")) == KVResult(Status.OK, 4)
    assert log(encode_cas_revision(b"k", 1, b"stale")) == KVResult(Status.CAS_FAILED, 4)
    assert log(encode_cas_revision(b"k", 4, b"third")) == KVResult(Status.OK, 6)
    assert log.kv.get(b"k") == KeyValue(b"k", b"third", 1, 6, 3)
    assert log(encode_cas(b"absent", b"", b"x")) == KVResult(Status.CAS_FAILED, 0)  # absent != b""
    assert log(encode_cas_revision(b"absent", 6, b"x")) == KVResult(Status.CAS_FAILED, 0)
    assert log.kv.revision == 6 and log.kv.get(b"absent") is None


def test_scan_is_in_byte_order_by_prefix_with_limit_and_start():
    log = Log()
    for k in (b"b/2", b"a", b"b/1", b"b/10", b"c", b"b", b"b/\xff"):
        log(encode_put(k, k.upper()))
    keys = lambda items: [kv.key for kv in items]  # noqa: E731
    assert keys(log.kv.scan(b"b/")) == [b"b/1", b"b/10", b"b/2", b"b/\xff"]
    assert keys(log.kv.scan()) == [b"a", b"b", b"b/1", b"b/10", b"b/2", b"b/\xff", b"c"]
    assert keys(log.kv.scan(b"b/", limit=2)) == [b"b/1", b"b/10"]
    assert keys(log.kv.scan(b"b/", start=b"b/10\0")) == [b"b/2", b"b/\xff"]
    assert keys(log.kv.scan(b"b/", start=b"a")) == [b"b/1", b"b/10", b"b/2", b"b/\xff"]
    assert log.kv.scan(b"zz") == [] and log.kv.scan(b"b/", start=b"c") == []
    log(encode_delete(b"b/10"))
    log(encode_put(b"b/0", b"new"))
    log(encode_delete(b"b/2"))
    log(encode_put(b"b/2", b"back"))  # deleted and re-created before the next scan
    assert keys(log.kv.scan(b"b/")) == [b"b/0", b"b/1", b"b/2", b"b/\xff"]
    assert log.kv.scan(b"b/2")[0].value == b"back"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([b"a", b"ab", b"abc", b"b", b"ba", b"\x00", b"\xff"]),
                          st.sampled_from([b"", b"a", b"b", b"ab"])), max_size=40))
def test_scans_interleaved_with_creates_and_deletes_match_a_sorted_model(steps):
    log, model = Log(), {}
    for put, key, prefix in steps:
        if put:
            log(encode_put(key, b"v"))
            model[key] = b"v"
        else:
            log(encode_delete(key))
            model.pop(key, None)
        assert [kv.key for kv in log.kv.scan(prefix)] == sorted(k for k in model if k.startswith(prefix))


def test_apply_refuses_an_index_out_of_order_as_an_applier_bug():
    kv = KVStateMachine()
    kv.apply([CommittedEntry(5, 1, encode_put(b"k", b"v"))])
    for bad in (5, 4):
        with pytest.raises(StateMachineError, match=f"entry {bad} applied after 5"):
            kv.apply([CommittedEntry(bad, 1, encode_put(b"k", b"w"))])
    assert kv.get(b"k").value == b"v"


def test_memoryview_bodies_apply_like_bytes_and_are_copied():
    buf = bytearray(encode_put(b"k", b"value"))
    kv = KVStateMachine()
    kv.apply([CommittedEntry(1, 1, memoryview(buf))])
    buf[-5:] = b"XXXXX"  # the store reuses its mapping: the state must not change with it
    assert kv.get(b"k") == KeyValue(b"k", b"value", 1, 1, 1)


# --------------------------------------------------------------------------- refusals


def test_client_encoders_refuse_what_apply_would_refuse():
    for call, status in [
        (lambda: encode_put(b"", b"v"), Status.EMPTY_KEY),
        (lambda: encode_put(b"k" * (MAX_KEY_SIZE + 1), b"v"), Status.KEY_TOO_LARGE),
        (lambda: encode_put(b"k", b"v" * (MAX_VALUE_SIZE + 1)), Status.VALUE_TOO_LARGE),
        (lambda: encode_delete(b""), Status.EMPTY_KEY),
        (lambda: encode_cas(b"k", b"e" * (MAX_VALUE_SIZE + 1), b"v"), Status.VALUE_TOO_LARGE),
        (lambda: encode_cas_revision(b"k", 0, b"v"), Status.MALFORMED),
        (lambda: encode_get(b""), Status.EMPTY_KEY),
        (lambda: encode_scan(b"p", 0), Status.MALFORMED),
        (lambda: encode_scan(b"p", MAX_SCAN_LIMIT + 1), Status.MALFORMED),
        (lambda: encode_scan(b"p" * (MAX_KEY_SIZE + 1)), Status.KEY_TOO_LARGE),
    ]:
        with pytest.raises(KVInputError) as ei:
            call()
        assert ei.value.status is status and isinstance(ei.value, ValueError)
    with pytest.raises(TypeError, match="key must be bytes, not str"):
        encode_put("k", b"v")
    with pytest.raises(TypeError, match="value must be bytes, not int"):
        encode_put(b"k", 5)
    # the limits themselves are allowed
    body = encode_put(b"k" * MAX_KEY_SIZE, b"v" * MAX_VALUE_SIZE)
    assert decode_command(body) == Put(b"k" * MAX_KEY_SIZE, b"v" * MAX_VALUE_SIZE)
    assert decode_command(encode_put(bytearray(b"k"), memoryview(b"v"))) == Put(b"k", b"v")


def _big_key_put() -> bytes:
    k = b"k" * (MAX_KEY_SIZE + 1)
    return bytes([Op.PUT]) + len(k).to_bytes(2, "big") + k


MALFORMED = [
    (b"", Status.MALFORMED, "empty command"),
    (b"\x01", Status.MALFORMED, "shorter than its header"),
    (b"\x01\x00\x05ab", Status.MALFORMED, "key length 5 runs past"),
    (b"\x02\x00\x01kX", Status.MALFORMED, "DELETE with 1 bytes after the key"),
    (b"\x01\x00\x00value", Status.EMPTY_KEY, "empty key"),
    (_big_key_put(), Status.KEY_TOO_LARGE, f"key of {MAX_KEY_SIZE + 1} bytes"),
    (b"\x01\x00\x01k" + b"v" * (MAX_VALUE_SIZE + 1), Status.VALUE_TOO_LARGE, "value of"),
    (b"\x03\x00\x00\x01", Status.MALFORMED, "shorter than its header"),
    (b"\x03\x00\x00\x01\x00\x00\x00\x01kXv", Status.MALFORMED, "expecting absence carries an operand"),
    (b"\x03\x02\x00\x01\x00\x00\x00\x07k1234567v", Status.MALFORMED, "revision operand of 7 bytes"),
    (b"\x03\x09\x00\x01\x00\x00\x00\x00kv", Status.MALFORMED, "unknown CAS expectation 9"),
    (b"\x03\x01\x00\x01\x00\x00\x00\x09kv", Status.MALFORMED, "run past"),
    (b"\x7f\x00\x01k", Status.UNKNOWN_OP, "unknown op 0x7f"),
    (encode_get(b"k"), Status.UNKNOWN_OP, "is a query, not a command"),
]


@pytest.mark.parametrize("body, status, message", MALFORMED)
def test_a_malformed_entry_is_an_error_result_and_changes_nothing(body, status, message):
    log = Log()
    log(encode_put(b"k", b"v"))
    log(encode_put(b"l", b"w"))
    before = snap(log.kv)
    r = log(body)
    assert (r.status, r.revision, r.ok, r.changed) == (status, 2, False, False)
    assert message in r.message
    assert isinstance(decode_command(body), Invalid)
    # nothing changed but the applied index (which the snapshot header records)
    assert log.kv.revision == 2 and log.kv.last_index == 3
    assert [(kv.key, kv.value, kv.mod_revision) for kv in log.kv.scan()] == [(b"k", b"v", 1), (b"l", b"w", 2)]
    after = snap(log.kv)  # the same image but for the header's last_index (bytes 8..16) and CRC
    assert after[:8] + after[16:-8] == before[:8] + before[16:-8]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.builds(lambda op, rest: bytes([op]) + rest,
                                           st.sampled_from([1, 2, 3]), st.binary(max_size=20)))
def test_no_body_makes_decode_or_apply_raise(body):
    cmd = decode_command(body)
    assert isinstance(cmd, Put | Delete | Cas | Invalid)
    log = Log()
    r = log(body)
    assert r.changed == (not isinstance(cmd, Invalid))


def test_results_round_trip_and_garbage_is_refused_client_side():
    assert decode_result(encode_result(Status.CAS_FAILED, 7)) == KVResult(Status.CAS_FAILED, 7)
    assert decode_result(encode_result(Status.EMPTY_KEY, 3, "empty key")).message == "empty key"
    with pytest.raises(ValueError, match="shorter"):
        decode_result(b"\x00")
    with pytest.raises(ValueError, match="unknown KV result status 99"):
        decode_result(bytes([99]) + bytes(8))


# --------------------------------------------------------------------------- queries


def test_get_and_scan_queries():
    log = Log()
    log(encode_put(b"a/1", b"x"))
    log(encode_put(b"a/2", b"y"))
    log(encode_put(b"b", b"z"))
    rep = decode_query_reply(log.kv.query(encode_get(b"a/2")))
    assert (rep.status, rep.revision, rep.items) == (Status.OK, 3, [KeyValue(b"a/2", b"y", 2, 2, 1)])
    rep = decode_query_reply(log.kv.query(encode_get(b"nope")))
    assert (rep.status, rep.items) == (Status.NOT_FOUND, [])
    rep = decode_query_reply(log.kv.query(encode_scan(b"a/", limit=1)))
    assert ([kv.key for kv in rep.items], rep.more) == ([b"a/1"], True)
    rep = decode_query_reply(log.kv.query(encode_scan(b"a/", limit=1, start=b"a/1\0")))
    assert ([kv.key for kv in rep.items], rep.more) == ([b"a/2"], False)
    assert decode_query_reply(log.kv.query(encode_scan(b"a/", limit=2))).more is False


@pytest.mark.parametrize("request_, status", [
    (b"", Status.MALFORMED),
    (b"\x41\x00\x05k", Status.MALFORMED),
    (b"\x41\x00\x00", Status.EMPTY_KEY),
    (b"\x42\x00\x00\x00\x00\x00\x00\x00\x00", Status.MALFORMED),  # limit 0
    (encode_put(b"k", b"v"), Status.UNKNOWN_OP),
])
def test_a_malformed_query_gets_an_error_reply(request_, status):
    kv = KVStateMachine()
    rep = decode_query_reply(kv.query(request_))
    assert rep.status is status and rep.items == [] and rep.message


def test_a_scan_reply_stops_near_its_byte_budget_but_always_holds_one_item():
    log = Log()
    big = b"v" * MAX_VALUE_SIZE
    for i in range(6):
        log(encode_put(b"k%d" % i, big))
    rep = decode_query_reply(log.kv.query(encode_scan(b"k")))
    assert rep.more and len(rep.items) == 4  # 4 MiB of budget
    assert log.kv._scan(b"k", b"", None, 1) == (log.kv.scan(b"k", 1), True)


def test_query_replies_round_trip_and_truncation_is_refused():
    items = [KeyValue(b"a", b"1", 1, 2, 2), KeyValue(b"b", b"", 3, 3, 1)]
    data = encode_query_reply(Status.OK, 9, items, more=True)
    rep = decode_query_reply(data)
    assert (rep.revision, rep.items, rep.more) == (9, items, True)
    for cut in (5, 20, len(data) - 1):
        with pytest.raises(ValueError):
            decode_query_reply(data[:cut])


# --------------------------------------------------------------------------- determinism

KEYS = st.sampled_from([b"a", b"ab", b"b", b"ba", b"\x00", b"\xff\xff"])
VALUES = st.binary(max_size=6)
COMMANDS = st.one_of(
    st.builds(encode_put, KEYS, VALUES),
    st.builds(encode_delete, KEYS),
    st.builds(encode_cas, KEYS, st.none() | VALUES, VALUES),
    st.builds(encode_cas, KEYS, st.sampled_from([b"", b"x"]), VALUES),
    st.builds(encode_cas_revision, KEYS, st.integers(1, 40), VALUES),
    st.binary(max_size=12),  # mostly malformed
)
LOGS = st.lists(st.tuples(COMMANDS, st.integers(1, 3)), max_size=50)  # (body, index gap)


def _entries(log: list[tuple[bytes, int]]) -> list[CommittedEntry]:
    out, index = [], 0
    for body, gap in log:
        index += gap  # gaps are NOOPs, never passed to apply
        out.append(CommittedEntry(index, 1, body))
    return out


def _model(entries: list[CommittedEntry]) -> tuple[dict, list[KVResult]]:
    """The semantics, written as plainly as possible: key -> (value, create, mod, version)."""
    state, results, rev = {}, [], 0
    for e in entries:
        cmd = decode_command(e.body)
        old = state.get(cmd.key) if not isinstance(cmd, Invalid) else None
        if isinstance(cmd, Invalid):
            results.append(KVResult(cmd.status, rev, cmd.message))
            continue
        if isinstance(cmd, Delete):
            if old is None:
                results.append(KVResult(Status.NOT_FOUND, rev))
                continue
            del state[cmd.key]
        else:
            if isinstance(cmd, Cas):
                hit = {Expect.ABSENT: old is None,
                       Expect.VALUE: old is not None and old[0] == cmd.expected_value,
                       Expect.REVISION: old is not None and old[2] == cmd.expected_revision}[cmd.expect]
                if not hit:
                    results.append(KVResult(Status.CAS_FAILED, 0 if old is None else old[2]))
                    continue
            state[cmd.key] = (cmd.value, e.index, e.index, 1) if old is None else (cmd.value, old[1], e.index, old[3] + 1)
        rev = e.index
        results.append(KVResult(Status.OK, e.index))
    return state, results


def _apply_in_batches(kv: KVStateMachine, entries: list[CommittedEntry], sizes: list[int]) -> list[bytes]:
    out, i = [], 0
    for n in sizes:
        out += kv.apply(entries[i:i + n])
        i += n
    return out + kv.apply(entries[i:])


@settings(max_examples=150, deadline=None)
@given(LOGS, st.lists(st.integers(0, 5), max_size=20))
def test_replicas_fed_the_same_log_agree_with_each_other_and_the_model(log, batches):
    entries = _entries(log)
    one, two = KVStateMachine(), KVStateMachine()
    r1 = one.apply(entries)
    r2 = _apply_in_batches(two, entries, batches)  # batching is the applier's business only
    assert r1 == r2
    state, expected = _model(entries)
    assert [decode_result(r) for r in r1] == expected
    assert {kv.key: (kv.value, kv.create_revision, kv.mod_revision, kv.version) for kv in one.scan()} == state
    assert snap(one) == snap(two)


@settings(max_examples=150, deadline=None)
@given(LOGS, st.data())
def test_snapshot_then_restore_then_the_rest_equals_applying_everything(log, data):
    entries = _entries(log)
    k = data.draw(st.integers(0, len(entries)), label="snapshot after")
    whole = KVStateMachine()
    whole_results = whole.apply(entries)

    first = KVStateMachine()
    first.apply(entries[:k])
    image = snap(first)
    second = restored(image)
    assert snap(second) == image  # canonical: the restored state writes the same bytes
    assert second.apply(entries[k:]) == whole_results[k:]
    assert snap(second) == snap(whole)
    assert second.scan() == whole.scan() and second.revision == whole.revision


def test_equal_states_write_identical_snapshots_whatever_the_insertion_order():
    a = Log()
    a(encode_put(b"y", b"2"))
    a(encode_put(b"x", b"1"))
    a(encode_put(b"z", b"3"))
    a(encode_delete(b"z"))
    assert list(a.kv._data) == [b"y", b"x"]  # a dict remembers insertion order...
    b = restored(snap(a.kv))
    assert list(b._data) == [b"x", b"y"]  # ...and a restored one holds the image's order
    assert snap(b) == snap(a.kv)  # the image is canonical all the same


# --------------------------------------------------------------------------- damaged snapshots


def _small_state() -> KVStateMachine:
    log = Log()
    log(encode_put(b"alpha", b"1"))
    log(encode_put(b"beta", b""))
    log(encode_put(b"alpha", b"22"))
    log(encode_cas(b"gamma", None, b"333"))
    return log.kv


def _other_state() -> tuple[KVStateMachine, bytes]:
    log = Log()
    log(encode_put(b"mine", b"untouched"))
    return log.kv, snap(log.kv)


def _rejects(kv: KVStateMachine, image: bytes, match: str | None = None) -> None:
    before = snap(kv)
    with pytest.raises(SnapshotFormatError, match=match):
        kv.restore(io.BytesIO(image))
    assert snap(kv) == before, "a refused snapshot must leave the state as it was"


def test_every_flipped_byte_is_rejected_and_the_state_is_left_as_it_was():
    image = snap(_small_state())
    kv, _ = _other_state()
    for pos in range(len(image)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(image)
            damaged[pos] ^= mask
            _rejects(kv, bytes(damaged))
    assert kv.get(b"mine").value == b"untouched" and kv.get(b"alpha") is None


def test_a_truncated_or_extended_stream_is_rejected():
    image = snap(_small_state())
    kv, _ = _other_state()
    for cut in range(len(image)):
        _rejects(kv, image[:cut])
    _rejects(kv, image + b"\0", "bytes after its end marker")
    _rejects(kv, b"", "truncated")


def _image(records: list[tuple[bytes, bytes, int, int, int]], revision: int = 10, last_index: int = 10,
           fmt: int = 1) -> bytes:
    """A hand-built image with a correct CRC: the checks behind the CRC must hold on their own."""
    body = struct.pack(">4sHHqQQ", b"DLKV", fmt, 0, last_index, revision, len(records))
    for k, v, c, m, ver in records:
        body += struct.pack(">HIQQQ", len(k), len(v), c, m, ver) + k + v
    return body + struct.pack(">4sI", SNAPSHOT_END, crc32c(body))


@pytest.mark.parametrize("image, match", [
    (_image([(b"a", b"1", 1, 2, 2)]), ""),  # the builder itself is right: see the first assert
    (_image([(b"b", b"1", 1, 1, 1), (b"a", b"2", 2, 2, 1)]), "keys out of order"),
    (_image([(b"a", b"1", 1, 1, 1), (b"a", b"2", 2, 2, 1)]), "keys out of order"),
    (_image([(b"", b"1", 1, 1, 1)]), "sizes 0/1 out of range"),
    (_image([(b"k" * (MAX_KEY_SIZE + 1), b"", 1, 1, 1)]), "out of range"),
    (_image([(b"a", b"1", 3, 2, 1)]), "revisions out of range"),  # created after modified
    (_image([(b"a", b"1", 1, 11, 1)]), "revisions out of range"),  # after the store revision
    (_image([(b"a", b"1", 1, 1, 0)]), "revisions out of range"),  # version 0
    (_image([], revision=11, last_index=10), "revision 11 after its last index 10"),
    (_image([], fmt=2), "format 2 flags 0 not supported"),
    (b"NOPE" + bytes(40), "not a KV snapshot"),
])
def test_well_checksummed_but_inconsistent_images_are_rejected(image, match):
    kv, _ = _other_state()
    if not match:
        kv.restore(io.BytesIO(image))
        assert kv.get(b"a") == KeyValue(b"a", b"1", 1, 2, 2) and kv.get(b"mine") is None
        return
    _rejects(kv, image, match)


def test_a_restored_instance_replaces_its_state_and_keeps_checking_the_order():
    image = snap(_small_state())
    kv, _ = _other_state()
    kv.restore(io.BytesIO(image))
    assert kv.get(b"mine") is None and kv.get(b"alpha") == KeyValue(b"alpha", b"22", 1, 3, 2)
    assert (kv.revision, kv.last_index) == (4, 4)
    with pytest.raises(StateMachineError):
        kv.apply([CommittedEntry(4, 1, encode_put(b"x", b"y"))])
    assert decode_result(kv.apply([CommittedEntry(5, 1, encode_delete(b"beta"))])[0]).changed


class _Trickle(io.RawIOBase):
    """A reader that returns at most 7 bytes per read, like a pipe or a socket."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = 7 if n < 0 else min(n, 7)
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out


class _Writes(io.RawIOBase):
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.sizes.append(len(b))
        self.parts.append(bytes(b))
        return len(b)


def test_snapshots_stream_in_bounded_pieces_and_restore_from_short_reads():
    log = Log()
    for i in range(3):
        log(encode_put(b"big%d" % i, bytes([i]) * MAX_VALUE_SIZE))
    for i in range(2000):
        log(encode_put(b"small%05d" % i, b"s" * 100))
    w = _Writes()
    log.kv.snapshot(w)
    assert len(w.sizes) >= 3, "a 3+ MiB state is written in several pieces"
    assert max(w.sizes) <= (1 << 20) + 30 + MAX_KEY_SIZE + MAX_VALUE_SIZE
    image = b"".join(w.parts)
    assert image == snap(log.kv)
    kv = KVStateMachine()
    kv.restore(_Trickle(image))
    assert snap(kv) == image and kv.get(b"big2").value[:3] == b"\x02\x02\x02"
