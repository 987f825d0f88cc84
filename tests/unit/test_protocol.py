"""ipc.protocol (the one wire codec) and the ipc.sockets conventions.

Decoding is total: a message or ProtocolError, nothing else, for any byte string (docs/contracts.md
C23).
"""

import random
import struct

import pytest

from ipc import protocol as p
from ipc.codes import ResponseCode, Role, VoteResult
from ipc.protocol import ProtocolError, PushKind, decode, encode
from node.store.codec import encode_entry, iter_entries

ENTRIES = encode_entry(5, 2, 0, b"hello") + encode_entry(6, 2, 53, b"")

MESSAGES = [
    p.AppendRequest("default", "n0", b"body", request_id=1),
    p.AppendRequest("g", "n1", b"", request_id=2**64 - 1),
    p.BatchAppendRequest("default", "n0", [b"a", b"", b"ccc"], request_id=3),
    p.BatchAppendRequest("default", "n0", [], request_id=4),
    p.AppendRequest("default", "n0", b"stamped", request_id=24, session=0x00030001, seq=2**32 - 1),
    p.BatchAppendRequest("default", "n0", [b"a", b"bb"], request_id=25, session=9, first_seq=7),
    p.BatchAppendRequest("default", "n0", [b"x" * 8], request_id=26, session=9, first_seq=0),
    p.OpenSessionRequest("default", "n0", request_id=27),
    p.OpenSessionResponse(200, "default", 4, "n0", 0x00040001, request_id=28),
    p.QueryRequest("default", "n0", b"\x10get k", request_id=40),
    p.QueryRequest("default", "n0", b""),
    p.QueryRequest("default", "n1", b"\x10get k", request_id=47, any_member=True),
    p.AppendRequest("default", "n0", b"put", request_id=48, session=3, seq=4, no_result=True),
    p.ReadIndexRequest("default", "n0", request_id=49),
    p.ReadIndexResponse(200, "default", 4, "n0", 1234, request_id=50),
    p.ReadIndexResponse(404, "default", 5, ""),
    p.FetchRequest("default", "n1", 12, 500, 1 << 20, 1000, request_id=51),
    p.FetchResponse(200, "default", 4, "n0", 3, 40, b"entries", request_id=51),
    p.FetchResponse(200, "default", 4, "", -1, -1),
    p.SnapshotRequest("default", "n1", request_id=45),
    p.SnapshotResponse(200, "default", 4, "n0", 99, 3, request_id=46),
    p.InstallRequest("default", "n1", "n0", 4, b'{"last_index": 9}', 1 << 20, b"chunk", request_id=47),
    p.InstallRequest("default", "n1", "n0", 4, b"{}", 0),
    p.InstallResponse(200, "default", 4, "n0", 1 << 20, False, request_id=48),
    p.InstallResponse(200, "default", 4, "n0", 77, True),
    p.QueryResponse(200, "default", 4, "n0", 77, b"answer", request_id=41),
    p.QueryResponse(404, "default", 4, "n1"),
    p.AppendResponse(200, "default", 4, "n0", 12, 4096, request_id=42, result=b"ok"),
    p.AppendResponse(200, "default", 4, "n0", 12, 4096, request_id=43, result=b""),
    p.BatchAppendResponse(200, "default", 4, "n0", 10, [0, 53], request_id=44, results=[b"r", None]),
    p.GetRequest("default", "n2", 17, 100, True, request_id=5),
    p.GetRequest("default", "n2", -1, 0, False),
    p.MetadataRequest("default", "n0", request_id=6),
    p.MetadataRequest("default", "n0", request_id=6, want_status=True),
    p.MetadataRequest("default", "n0", request_id=6, want_status=True, want_config=True),
    p.MetadataRequest("default", "n0", request_id=6, want_status=True, want_config=True, want_end_term=True),
    p.LeadershipTransferRequest("default", "n0", "n1", 7, request_id=7),
    p.PushRequest("default", "n1", "n0", 3, PushKind.APPEND, 4, 5, 2, ENTRIES, request_id=8),
    p.PushRequest("default", "n1", "n0", 3, PushKind.APPEND, 4, 5, 2, ENTRIES, request_id=23,
                  run_crc=0xDEADBEEF),
    p.PushRequest("default", "n1", "n0", 3, PushKind.COMPARE, 4, -1, 0, b"", 9, 2),
    p.PushRequest("default", "n1", "n0", 3, PushKind.COMMIT, 10),
    p.PushRequest("default", "n1", "n0", 3, PushKind.TRUNCATE, 10, 7),
    p.VoteRequest("default", "n1", "n0", 4, 3, 99, request_id=9),
    p.HeartbeatRequest("default", "n1", "n0", 4, request_id=10),
    p.TakeLeadershipRequest("default", "n1", "n0", 4, request_id=11),
    p.AppendResponse(200, "default", 4, "n0", 12, 4096, request_id=12),
    p.AppendResponse(404, "default", 4, "", request_id=13),
    p.BatchAppendResponse(200, "default", 4, "n0", 10, [0, 53, 106], request_id=14),
    p.BatchAppendResponse(503, "default", 4, "n0"),
    p.GetResponse(200, "default", 4, "n0", ENTRIES, request_id=15),
    p.MetadataResponse(200, "default", 4, "n0", "n0", Role.LEADER, 0, 9, 8,
                       [p.PeerInfo("n0", "127.0.0.1:20911", 9),
                        p.PeerInfo("n1", "127.0.0.1:20912", 7)], request_id=16),
    p.MetadataResponse(200, "default", 0, "", "n1", Role.CANDIDATE),
    p.MetadataResponse(200, "default", 4, "n0", "n0", Role.LEADER, 0, 9, 8, [], request_id=18,
                       status=p.NodeStatus("1.0", 10, 0.5, 3, 8, 4096, (1, 0, 2))),
    p.MetadataResponse(200, "default", 4, "n0", "n0", Role.LEADER, 0, 9, 8, [], request_id=19,
                       status=p.NodeStatus("1.0", 10, 0.5, 3, 8, 4096, (1, 0, 2),
                                           (12, ("n0", "n1", "n3"), ("n4",)))),
    p.MetadataResponse(200, "default", 4, "n0", "n0", Role.LEADER, 0, 9, 8, [], request_id=19,
                       status=p.NodeStatus("1.0", 10, 0.5, 3, 8, 4096, (1, 0, 2),
                                           (-1, ("n0", "n1", "n3"), ()), 3)),
    p.MetadataResponse(200, "default", 4, "n0", "n0", Role.LEADER, -1, -1, -1, [], request_id=19,
                       status=p.NodeStatus("1.0", 10, 0.5, 3, 8, 4096, (1, 0, 2),
                                           (-1, ("n0",), ()), -1)),
    p.TransferResponse(200, "default", 5, "n1", request_id=17),
    p.PushResponse(406, "default", 4, "n0", 7, 0, 6, 2, 3, request_id=18),
    p.VoteResponse(200, "default", 4, "", VoteResult.REJECT_TAKING_LEADERSHIP, 3, 9, 19),
    p.HeartbeatResponse(403, "default", 9, "n2", request_id=20),
    p.TakeLeadershipResponse(418, "default", 5, "", request_id=21),
    p.ErrorResponse(411, "default", 3, "n0", "bad frame: ünïcode", 0x06, request_id=22),
    p.ErrorResponse(-1),
    p.Multi([encode(p.AppendRequest("default", "n0", b"x", request_id=30)),
             encode(p.MetadataRequest("default", "n0", request_id=31))]),
    p.Multi([encode(p.AppendResponse(200, "default", 4, "n0", 12, 4096, request_id=30)), b""],
            response=True),
    p.MemberChangeRequest("default", "n0", 1, "n3", "10.0.0.3", 20006, "", request_id=32),
    p.MemberChangeRequest("default", "n0", 3, "n1", request_id=33),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: f"{type(m).__name__}-{m.request_id}")
def test_round_trip(msg):
    frame = encode(msg)
    assert isinstance(frame, bytes)
    got = decode(frame)
    assert type(got) is type(msg)
    assert got == msg
    # memoryview and bytearray input decode the same
    assert decode(memoryview(frame)) == msg
    assert decode(bytearray(frame)) == msg
    # re-encoding the decoded message is byte-identical (canonical form)
    assert encode(got) == frame


def test_every_message_type_is_covered():
    assert {type(m) for m in MESSAGES} == set(p._ENCODERS)
    assert {m.TYPE for m in MESSAGES} == set(p.MsgType)


def test_prefix_layout():
    frame = encode(p.HeartbeatRequest("g", "n1", "n0", 7, request_id=0x0102030405060708))
    assert frame[:12] == struct.pack(">BBHQ", 1, 8, 0, 0x0102030405060708)
    assert p.peek_header(frame) == (1, 8, 0x0102030405060708)
    assert p.peek_header(b"\x01\x08") is None


def test_batch_of_many_bodies_is_zero_copy_views():
    rnd = random.Random(7)
    bodies = [bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 0, 1, 5, 300])))
              for _ in range(2000)]
    frame = encode(p.BatchAppendRequest("default", "n0", bodies, request_id=99))
    got = decode(frame)
    assert len(got.bodies) == 2000
    assert [bytes(b) for b in got.bodies] == bodies
    assert all(isinstance(b, memoryview) for b in got.bodies)
    assert sum(1 for b in got.bodies if len(b) == 0) > 100


def test_get_response_blob_decodes_with_store_codec():
    got = decode(encode(p.GetResponse(200, "default", 2, "n0", ENTRIES)))
    entries = [e for _off, e in iter_entries(got.entries)]
    assert [(e.index, e.term, bytes(e.body)) for e in entries] == [(5, 2, b"hello"), (6, 2, b"")]


def test_push_entries_blob_passes_through_untouched():
    msg = p.PushRequest("default", "n1", "n0", 3, PushKind.APPEND, 4, 5, 2, ENTRIES)
    frame = encode(msg)
    assert frame.endswith(ENTRIES + b"\x00\x00\x00\x00")  # then an empty index-records field
    assert bytes(decode(frame).entries) == ENTRIES


def test_push_index_records_must_describe_count_entries():
    recs = bytes(64)
    assert bytes(decode(encode(p.PushRequest("g", "n1", "n0", 3, PushKind.APPEND, 4, 5, 2, ENTRIES,
                                             index_records=recs))).index_records) == recs
    with pytest.raises(p.ProtocolError, match="index records"):
        decode(encode(p.PushRequest("g", "n1", "n0", 3, PushKind.APPEND, 4, 5, 2, ENTRIES,
                                    index_records=bytes(96))))


def test_push_run_crc_is_an_optional_trailer():
    """`run_crc` travels as a u32 after the index records, only when present; a frame without
    it (an older leader's) decodes with -1, and the value round-trips over its whole range."""
    recs = bytes(64)
    plain = encode(p.PushRequest("g", "n1", "n0", 3, PushKind.APPEND, 4, 5, 2, ENTRIES, index_records=recs))
    assert decode(plain).run_crc == -1
    for crc in (0, 1, 0x7FFFFFFF, 0xFFFFFFFF):
        msg = p.PushRequest("g", "n1", "n0", 3, PushKind.APPEND, 4, 5, 2, ENTRIES, index_records=recs,
                            run_crc=crc)
        frame = encode(msg)
        assert frame == plain + struct.pack(">I", crc)
        got = decode(frame)
        assert got.run_crc == crc and bytes(got.index_records) == recs and bytes(got.entries) == ENTRIES
    for extra in (1, 3, 5, 8):  # anything but exactly one u32 after the records is garbage
        with pytest.raises(ProtocolError, match="trailing garbage"):
            decode(plain + b"\x01" * extra)
    for bad in (-2, 1 << 32):
        with pytest.raises(ProtocolError, match="run_crc"):
            encode(p.PushRequest("g", "n1", "n0", 3, PushKind.APPEND, run_crc=bad))


# ------------------------------------------------------------------------- malformed frames

GOOD = encode(p.VoteRequest("default", "n1", "n0", 4, 3, 99, request_id=9))


@pytest.mark.parametrize("frame,needle", [
    pytest.param(b"", "short frame", id="empty"),
    pytest.param(GOOD[:11], "short frame", id="short-prefix"),
    pytest.param(b"\x02" + GOOD[1:], "version", id="wrong-version"),
    pytest.param(GOOD[:1] + b"\x42" + GOOD[2:], "unknown message type", id="unknown-type"),
    pytest.param(GOOD[:-1], "truncated", id="truncated-fields"),
    pytest.param(GOOD + b"\x00", "trailing garbage", id="trailing-garbage"),
    pytest.param(GOOD[:12] + b"\x40" + b"x" * 70, "exceeds 64", id="string-over-64"),
    pytest.param(GOOD[:12] + b"\x30" + b"ab", "runs past", id="string-past-end"),
    pytest.param(GOOD[:12] + b"\x02\xff\xfe" + GOOD[15:], "UTF-8", id="invalid-utf8"),
    pytest.param(encode(p.AppendRequest("g", "n", b"abc"))[:-1], "truncated", id="body-past-end"),
    pytest.param(encode(p.BatchAppendRequest("g", "n", [b"a"]))[:-6] + b"\xff\xff\xff\xff\x00",
                 "absurd batch count", id="absurd-batch-count"),
    pytest.param(encode(p.BatchAppendRequest("g", "n", [b"ab", b"c"])) + b"x",
                 "lengths sum", id="batch-lengths-mismatch"),
    pytest.param(encode(p.GetRequest("g", "n", 1))[:-1] + b"\x02", "linearizable",
                 id="bad-bool"),
    pytest.param(encode(p.BatchAppendResponse(200, "g", 1, "", 0, [1, 2]))[:-1], "position count",
                 id="positions-mismatch"),
    pytest.param(encode(p.VoteResponse(200, "g", 1, ""))[:-17] + b"\x63" + b"\x00" * 16,
                 "vote result", id="bad-vote-result"),
    pytest.param(encode(p.PushRequest("g", "n1", "n0", 3, PushKind.APPEND, count=1000,
                                      entries=b"x" * 48)), "absurd entry count",
                 id="absurd-push-count"),
])
def test_malformed_frames_raise_protocol_error(frame, needle):
    with pytest.raises(ProtocolError, match=needle):
        decode(frame)


def test_bad_push_kind_and_role():
    frame = bytearray(encode(p.PushRequest("g", "n1", "n0", 3, PushKind.COMMIT)))
    kind_at = 12 + 2 + 3 + 3 + 8
    assert frame[kind_at] == PushKind.COMMIT
    frame[kind_at] = 9
    with pytest.raises(ProtocolError, match="push kind"):
        decode(bytes(frame))
    meta = bytearray(encode(p.MetadataResponse(200, "g", 1, "", "n0", Role.LEADER)))
    role_at = 12 + 12 + 2 + 1 + 3
    assert meta[role_at] == Role.LEADER
    meta[role_at] = 7
    with pytest.raises(ProtocolError, match="role"):
        decode(bytes(meta))


def test_oversize_rejected():
    frame = encode(p.AppendRequest("default", "n0", b"x" * 5000))
    assert decode(frame, max_frame=len(frame)).body == b"x" * 5000
    with pytest.raises(ProtocolError, match="oversize frame"):
        decode(frame, max_frame=len(frame) - 1)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(frame, max_body=4999)
    batch = encode(p.BatchAppendRequest("default", "n0", [b"a", b"y" * 100]))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(batch, max_body=99)


def test_encode_rejects_unencodable_values():
    with pytest.raises(ProtocolError, match="exceeds 64"):
        encode(p.AppendRequest("g" * 65, "n0", b""))
    with pytest.raises(ProtocolError, match="cannot encode"):
        encode(p.GetRequest("g", "n0", 0, count=-1))
    with pytest.raises(ProtocolError, match="not a protocol message"):
        encode("hello")  # type: ignore[arg-type]
    # error reasons are cut, never refused: an error must always be reportable
    long = p.ErrorResponse(500, reason="é" * 300)
    assert len(decode(encode(long)).reason.encode()) <= 255


def test_error_reply_echoes_request_id_from_raw_or_decoded():
    frame = encode(p.AppendRequest("g", "n0", b"abc", request_id=77))[:-1]  # malformed
    with pytest.raises(ProtocolError):
        decode(frame)
    err = p.error_reply(frame, ResponseCode.UNEXPECTED_ARGUMENT, group="g", term=3, reason="bad")
    assert (err.request_id, err.request_type, err.code) == (77, p.MsgType.APPEND, 411)
    err2 = p.error_reply(p.GetRequest("g", "n0", 1, request_id=5), ResponseCode.NOT_LEADER)
    assert (err2.request_id, err2.request_type) == (5, p.MsgType.GET)
    assert p.error_reply(b"", ResponseCode.UNKNOWN).request_id == 0
    assert decode(encode(err)) == err


# ------------------------------------------------------------------------- fuzzing

def _decode_total(frame: bytes) -> None:
    try:
        decode(frame, max_frame=1 << 20, max_body=1 << 16)
    except ProtocolError:
        pass  # the only allowed failure; anything else propagates and fails the test


def test_fuzz_random_bytes():
    rnd = random.Random(1234)
    valid_prefixes = [encode(m)[:12] for m in MESSAGES]
    for i in range(20_000):
        n = rnd.choice([0, 1, 5, 12, 13, 20, 40, 100, 300])
        junk = rnd.randbytes(n)
        if i % 2:  # half of them with a valid prefix, so the type decoders get exercised
            junk = rnd.choice(valid_prefixes) + junk
        _decode_total(junk)


def test_fuzz_mutations_and_truncations_of_valid_frames():
    rnd = random.Random(99)
    frames = [encode(m) for m in MESSAGES]
    decoded_ok = 0
    for _ in range(20_000):
        f = bytearray(rnd.choice(frames))
        op = rnd.randrange(4)
        if op == 0 and f:  # flip bytes
            for _ in range(rnd.randint(1, 3)):
                f[rnd.randrange(len(f))] = rnd.randrange(256)
        elif op == 1:  # truncate
            del f[rnd.randrange(len(f) + 1):]
        elif op == 2:  # insert
            at = rnd.randrange(len(f) + 1)
            f[at:at] = rnd.randbytes(rnd.randint(1, 8))
        else:  # delete a slice
            at = rnd.randrange(len(f))
            del f[at:at + rnd.randint(1, 8)]
        try:
            decode(bytes(f))
            decoded_ok += 1
        except ProtocolError:
            pass
    assert decoded_ok > 100  # many byte flips land in values: still decodable, as they should


# ------------------------------------------------------------------------- ipc.sockets conventions

def test_parse_peers_dledger_format():
    from ipc.sockets import elector_address, format_peers, parse_peers
    s = "n0-127.0.0.1:20911;n1-my-host.local:20912; n2-[::1]:20913;"
    peers = parse_peers(s)
    assert peers == {"n0": ("127.0.0.1", 20911), "n1": ("my-host.local", 20912),
                     "n2": ("::1", 20913)}
    assert list(peers) == ["n0", "n1", "n2"]
    assert parse_peers(format_peers(peers)) == peers
    assert elector_address("127.0.0.1", 20911) == "tcp://127.0.0.1:20912"


@pytest.mark.parametrize("bad,needle", [
    ("", "no peers"),
    ("n0127.0.0.1:1", "ID-HOST:PORT"),
    ("-127.0.0.1:1", "ID-HOST:PORT"),
    ("n0-127.0.0.1", "HOST:PORT"),
    ("n0-127.0.0.1:abc", "not a number"),
    ("n0-127.0.0.1:65535", "outside"),
    ("n0-a:1;n0-b:2", "twice"),
    ("x" * 65 + "-a:1", "longer than"),
])
def test_parse_peers_errors(bad, needle):
    from ipc.sockets import PeersError, parse_peers
    with pytest.raises(PeersError, match=needle):
        parse_peers(bad)


def test_ipc_path_stays_short_and_stable(tmp_path):
    from ipc.sockets import MAX_IPC_PATH, ipc_path
    assert ipc_path("/run/x", "elector") == "ipc:///run/x/elector"
    deep = "/tmp/" + "d" * 200
    a, b = ipc_path(deep, "handler.pub"), ipc_path(deep, "handler.pub")
    assert a == b and a.startswith("ipc:///tmp/dl-") and len(a) - len("ipc://") <= MAX_IPC_PATH
    assert a != ipc_path(deep, "ack")
    with pytest.raises(ValueError):
        ipc_path(tmp_path, "a/b")


def test_router_dealer_round_trip_over_ipc(tmp_path):
    import zmq

    from ipc.sockets import dealer, ipc_path, make_context, recv_routed, router, send_routed
    ctx = make_context()
    try:
        addr = ipc_path(tmp_path, "t")
        srv = router(ctx, addr)
        cli = dealer(ctx, addr, identity="n1")
        cli.send(encode(p.HeartbeatRequest("g", "n0", "n1", 1, request_id=5)))
        assert srv.poll(2000)
        ident, frame = recv_routed(srv)
        assert ident == b"n1"
        req = decode(frame)
        assert send_routed(srv, ident, encode(p.HeartbeatResponse(200, "g", 1, "n1",
                                                                  req.request_id)))
        assert cli.poll(2000)
        assert decode(cli.recv()).request_id == 5
        assert cli.getsockopt(zmq.LINGER) == 0 and cli.getsockopt(zmq.IMMEDIATE) == 1
        srv.close()
        cli.close()
    finally:
        ctx.term()


def test_multi_is_one_frame_of_whole_frames_and_rejects_abuse():
    inner = [encode(p.AppendRequest("g", "n0", b"%d" % i, request_id=i)) for i in range(3)]
    frame = p.encode_multi(inner)
    got = decode(frame)
    assert isinstance(got, p.Multi) and not got.response
    assert [decode(f) for f in got.frames] == [decode(f) for f in inner]
    assert p.encode_multi(inner[:1]) == inner[0]  # one frame needs no envelope
    with pytest.raises(ProtocolError, match="nested MULTI"):
        decode(encode(p.Multi([frame, inner[0]])))
    head = struct.pack(">BBHQ", 1, p.MsgType.MULTI, 0, 0)
    for bad, why in ((head + struct.pack(">I", 0), "absurd MULTI count"),
                     (head + struct.pack(">I", 10**6), "absurd MULTI count"),
                     (head + struct.pack(">I", 2) + struct.pack(">I", 3) + b"abc" + struct.pack(">I", 9), "MULTI inner frame"),
                     (head + struct.pack(">I", 1) + struct.pack(">I", 99) + b"abc", "MULTI inner frame"),
                     (frame + b"!", "trailing garbage")):
        with pytest.raises(ProtocolError, match=why):
            decode(bad)
    with pytest.raises(ProtocolError):
        encode(p.Multi([]))


@pytest.mark.parametrize("body", [b"", b"x", bytes(range(256)) * 9, memoryview(b"view")])
def test_encode_append_is_encode_of_an_append_request(body):
    for rid in (0, 1, 2**64 - 1):
        assert p.encode_append("g", "n0", body, rid) == encode(p.AppendRequest("g", "n0", body, rid))
    with pytest.raises(ProtocolError):
        p.encode_append("g", "n0", body, -1)
    with pytest.raises(ProtocolError):
        p.encode_append("g" * 65, "n0", body, 1)


def test_a_session_stamp_is_an_optional_trailer_older_frames_decode_unchanged():
    """Without a session nothing is added (the frame of an older client); with one, 8 bytes
    follow the body (or the batch's bodies), and a stamp with session 0 is malformed."""
    plain = encode(p.AppendRequest("g", "n0", b"body", request_id=1))
    stamped = encode(p.AppendRequest("g", "n0", b"body", request_id=1, session=5, seq=6))
    assert stamped == plain + struct.pack(">II", 5, 6)
    assert p.encode_append("g", "n0", b"body", 1, 5, 6) == stamped
    got = decode(stamped)
    assert (got.session, got.seq, bytes(got.body)) == (5, 6, b"body")
    with pytest.raises(p.ProtocolError):
        decode(plain + struct.pack(">II", 0, 6))
    with pytest.raises(p.ProtocolError):
        decode(plain + b"\0" * 7)  # neither a stamp nor nothing
    batch = encode(p.BatchAppendRequest("g", "n0", [b"a", b"b"], session=5, first_seq=9))
    assert decode(batch).first_seq == 9 and decode(batch[:-8]).session == 0


def test_install_request_refuses_a_negative_offset_and_an_oversized_meta():
    frame = bytearray(p.encode(p.InstallRequest("g", "n1", "n0", 1, b"{}", 0, b"x")))
    at = len(frame) - 1 - 4 - 8  # the i64 offset before the chunk's length and its one byte
    frame[at:at + 8] = (-5).to_bytes(8, "big", signed=True)
    with pytest.raises(p.ProtocolError, match="negative install offset"):
        p.decode(bytes(frame))
    with pytest.raises(p.ProtocolError, match="install meta"):
        p.encode(p.InstallRequest("g", "n1", "n0", 1, b"m" * (p.MAX_INSTALL_META + 1), 0))


def test_install_response_refuses_an_installed_flag_other_than_0_or_1():
    frame = bytearray(p.encode(p.InstallResponse(200, "g", 1, "n0", 5, True)))
    frame[-1] = 2
    with pytest.raises(p.ProtocolError, match="installed flag"):
        p.decode(bytes(frame))


def test_header_flags_no_result_and_any_member_older_frames_decode_unchanged():
    """The flags live in the header's reserved u16: a frame without them is byte-identical to
    an older client's, and bits a node does not know (or on other types) are ignored."""
    plain = encode(p.AppendRequest("g", "n0", b"body", request_id=1))
    flagged = encode(p.AppendRequest("g", "n0", b"body", request_id=1, no_result=True))
    assert flagged[:2] == plain[:2] and flagged[4:] == plain[4:]
    assert struct.unpack_from(">H", flagged, 2)[0] == p.FLAG_NO_RESULT
    assert p.encode_append("g", "n0", b"body", 1, no_result=True) == flagged
    assert decode(flagged).no_result is True and decode(plain).no_result is False
    q = encode(p.QueryRequest("g", "n1", b"r", request_id=2, any_member=True))
    assert struct.unpack_from(">H", q, 2)[0] == p.FLAG_ANY_MEMBER and decode(q).any_member
    assert decode(encode(p.QueryRequest("g", "n1", b"r"))).any_member is False

    def with_flags(frame: bytes, flags: int) -> bytes:
        return frame[:2] + struct.pack(">H", flags) + frame[4:]

    assert decode(with_flags(plain, 0x8000)) == decode(plain)  # unknown bit: ignored
    assert decode(with_flags(q, p.FLAG_NO_RESULT)).any_member is False  # another type's flag
    md = encode(p.MetadataRequest("g", "n0", request_id=3))
    assert decode(with_flags(md, 0xFFFF)) == decode(md)


def test_read_index_frames_reject_junk():
    req = encode(p.ReadIndexRequest("g", "n0", request_id=9))
    resp = encode(p.ReadIndexResponse(200, "g", 3, "n0", 17, request_id=9))
    for bad in (req + b"x", resp[:-1], resp + b"\0"):
        with pytest.raises(ProtocolError):
            decode(bad)
    assert p.is_response(decode(resp)) and not p.is_response(decode(req))


def test_fetch_frames_reject_junk():
    req = encode(p.FetchRequest("g", "n0", 5, 10, 100, 0, request_id=9))
    resp = encode(p.FetchResponse(200, "g", 3, "n0", 0, 17, b"", request_id=9))
    for bad in (req + b"x", req[:-1], resp[:-1], resp + b"\0"):
        with pytest.raises(ProtocolError):
            decode(bad)
    with pytest.raises(ProtocolError):
        encode(p.FetchRequest("g", "n0", 5, -1, 100, 0))  # a count that does not fit
    assert p.is_response(decode(resp)) and not p.is_response(decode(req))


# ------------------------------------------------------------------------- read-index messages

# Captured from the encoder before the read-index messages moved into the main tables: the
# wire between nodes must not change.
_READ_INDEX_BYTES = [
    (p.ReadIndexRequest("g1", "n0", 7), "010e00000000000000000007026731026e30"),
    (p.ReadIndexRequest("", "", 0), "010e000000000000000000000000"),
    (p.ReadIndexResponse(200, "g1", 3, "n2", 41, 7),
     "018e00000000000000000007000000c80000000000000003026731026e320000000000000029"),
    (p.ReadIndexResponse(404, "grp", 9, "", -1, 2**40),
     "018e000000000100000000000000019400000000000000090367727000ffffffffffffffff"),
]


@pytest.mark.parametrize("msg,hexed", _READ_INDEX_BYTES, ids=lambda x: getattr(x, "TYPE", ""))
def test_read_index_messages_encode_byte_identical_to_before(msg, hexed):
    assert p.encode(msg).hex() == hexed
    assert p.decode(bytes.fromhex(hexed)) == msg


def test_read_index_messages_sit_in_the_codec_main_tables():
    for cls in (p.ReadIndexRequest, p.ReadIndexResponse):
        assert cls in p._ENCODERS
        assert cls.TYPE in p._DECODERS and int(cls.TYPE) in p._DECODERS_BY_INT
    assert p._DECODERS_BY_INT == {int(k): v for k, v in p._DECODERS.items()}  # one source
