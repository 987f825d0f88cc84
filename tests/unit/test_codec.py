"""Entry/index codec (docs/store.md): exact byte layout, round trips, and hostile bytes."""

import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.store import codec


def test_header_layout_matches_spec_table():
    # magic 4, size 4, index 8, term 8, pos 8, channel 4, chainCrc 4, bodyCrc 4, bodySize 4
    assert codec.HEADER_SIZE == 48
    assert codec.INDEX_SIZE == 32
    raw = codec.encode_entry(7, 3, 4096, b"hello")
    magic, size, index, term, pos, channel, chain, crc, body_size = struct.unpack(">iiqqqiiIi", raw[:48])
    assert (magic, size, index, term, pos, channel, chain, body_size) == (1, 53, 7, 3, 4096, 0, 0, 5)
    assert crc == zlib.crc32(b"hello")
    assert raw[48:] == b"hello"


def test_crcmod_equals_zlib_and_c_extension_is_used():
    rnd = random.Random(1)
    for n in [0, 1, 7, 1024, 65537] + [rnd.randrange(4096) for _ in range(500)]:
        data = rnd.randbytes(n)
        # the fast path and crcmod (the design's reference) agree on every input
        assert codec.crc32(data) == codec.crc32_crcmod(data) == zlib.crc32(data)
    assert codec.CRC_USES_C_EXTENSION, "crcmod is running in pure Python (~30x slower)"


def test_blank_and_index_records():
    assert codec.encode_blank(100) == struct.pack(">ii", -1, 100)
    rec = codec.encode_index(codec.MAGIC_NORMAL, 123, 60, 9, 2)
    assert len(rec) == 32
    assert codec.decode_index(rec) == codec.IndexRecord(1, 123, 60, 9, 2)


@given(index=st.integers(0, 2**62), term=st.integers(0, 2**62), pos=st.integers(0, 2**62),
       body=st.binary(max_size=2000), noop=st.booleans())
@settings(max_examples=300, deadline=None)
def test_entry_round_trip(index, term, pos, body, noop):
    magic = codec.MAGIC_NOOP if noop else codec.MAGIC_NORMAL
    e = codec.decode_entry(codec.encode_entry(index, term, pos, body, magic))
    assert (e.index, e.term, e.pos, bytes(e.body), e.magic) == (index, term, pos, body, magic)


def test_encode_into_and_restamp_pos():
    buf = bytearray(200)
    n = codec.encode_entry_into(buf, 10, 1, 2, 3, b"abc")
    codec.restamp_pos(buf, 10, 999)
    e = codec.decode_entry(bytes(buf[10:10 + n]))
    assert e.pos == 999 and bytes(e.body) == b"abc"


def test_crc_mismatch_is_detected():
    raw = bytearray(codec.encode_entry(1, 1, 0, b"payload"))
    raw[-1] ^= 0x01
    with pytest.raises(codec.CodecError, match="CRC"):
        codec.decode_entry(bytes(raw))
    assert codec.decode_entry(bytes(raw), verify_crc=False).index == 1


def _decode_all(buf):
    return list(codec.iter_entries(buf))


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_raise_only_codec_error(seed):
    rnd = random.Random(seed)
    valid = b"".join(codec.encode_entry(i, 1, 0, rnd.randbytes(rnd.randrange(64))) for i in range(5))
    for _ in range(4000):
        choice = rnd.random()
        if choice < 0.4:
            data = rnd.randbytes(rnd.randrange(120))
        elif choice < 0.8:
            data = bytearray(valid)
            for _ in range(rnd.randrange(1, 4)):
                data[rnd.randrange(len(data))] = rnd.randrange(256)
            data = bytes(data)
        else:
            data = valid[: rnd.randrange(len(valid))]
        for fn in (_decode_all, codec.decode_header, codec.decode_index):
            try:
                fn(data)
            except codec.CodecError:
                pass
