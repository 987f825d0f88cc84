"""A single-producer, single-consumer ring of frames in shared memory (a local client's link).

Why a ring of our own and not a ZeroMQ socket: a process on the node's own machine (a broker
embedding the log) reaches the handler with one copy into memory both map and one doorbell
ring, where a ZeroMQ message costs a hand-off to the sender's I/O thread, a TCP or unix socket
and a hand-off from the receiver's (docs/performance.md "A local client over shared memory").

Layout (little-endian), every counter on its own 64-byte line so the two sides never write one:

    0    u32 magic "DLRG", u16 version 1, u16 0, u64 capacity (a power of two, bytes)
    64   u64 tail: bytes ever written (the producer's only word)
    128  u64 head: bytes ever consumed (the consumer's only word)
    192  capacity bytes of records

A record is a u32 length and the frame, padded to 8 bytes; a record never wraps: where the
next one does not fit before the end, the producer writes the length WRAP and continues at 0.

Invariant (one writer per word, x86-64 store order): the producer copies the record, then
stores `tail`; the consumer loads `tail`, reads the records below it, then stores `head`. A
reader of the other side's counter sees a value at most as new as the bytes it guards, because
each step is a separate CPython call and x86-64 keeps stores (and loads) in program order: the
same argument as the shared block's seqlock (docs/shared_state.md "Why it is correct here"),
on the same CPUs only (the link refuses others, as the block does). The two counters are
stored and loaded as one aligned 8-byte item of a `memoryview.cast("Q")`, never with
`struct.pack_into`, which zeroes its destination before storing (a reader could see 0). Each
side checks
what it reads from the other: a length past the written bytes or the frame limit is
`RingError`, never an over-read.
"""

from __future__ import annotations

import struct

MAGIC = b"DLRG"
VERSION = 1
HEADER = 192
TAIL_AT, HEAD_AT = 64, 128
_TAIL, _HEAD_WORD = TAIL_AT // 8, HEAD_AT // 8  # as items of the header cast to u64
WRAP = 0xFFFFFFFF
_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<4sHHQ")


class RingError(ValueError):
    """The ring's memory does not hold what this side wrote or may read: the peer is broken or
    hostile. The link is unusable from then on."""


def ring_size(capacity: int) -> int:
    """Bytes of shared memory a ring of `capacity` record bytes takes."""
    return HEADER + capacity


def _padded(n: int) -> int:
    return (4 + n + 7) & ~7


class Ring:
    """One direction of a link over `buf` (a writable memoryview of `ring_size(capacity)`
    bytes). `init` formats fresh memory; the other side attaches with `Ring(buf)`, which checks
    the header. One process puts, one process takes: never both on one ring."""

    __slots__ = ("buf", "cap", "mask", "max_frame", "words")

    def __init__(self, buf: memoryview, *, init_capacity: int = 0) -> None:
        if init_capacity:
            if init_capacity & (init_capacity - 1) or init_capacity < 64:
                raise ValueError("ring capacity must be a power of two >= 64")
            if len(buf) < ring_size(init_capacity):
                raise ValueError("ring memory smaller than its capacity")
            _HEAD.pack_into(buf, 0, MAGIC, VERSION, 0, init_capacity)
            words = buf[:HEADER].cast("Q")
            words[_TAIL] = words[_HEAD_WORD] = 0
        magic, version, _z, cap = _HEAD.unpack_from(buf, 0)
        if magic != MAGIC or version != VERSION:
            raise RingError(f"not a ring (magic {magic!r}, version {version})")
        if cap < 64 or cap & (cap - 1) or len(buf) < ring_size(cap):
            raise RingError(f"ring capacity {cap} does not fit its {len(buf)} bytes")
        self.buf, self.cap, self.mask = buf, cap, cap - 1
        self.words = buf[:HEADER].cast("Q")
        self.max_frame = cap // 2 - 8  # a frame always fits once the ring is empty

    # ---- producer --------------------------------------------------------------------------
    def put(self, frame: bytes | bytearray | memoryview) -> bool:
        """Append one frame; False when it does not fit now (the consumer is behind)."""
        n = len(frame)
        if n > self.max_frame:
            raise ValueError(f"frame of {n} bytes exceeds the ring's limit of {self.max_frame}")
        buf, words = self.buf, self.words
        tail, head = words[_TAIL], words[_HEAD_WORD]
        need = _padded(n)
        off = tail & self.mask
        room_to_end = self.cap - off
        skip = room_to_end if room_to_end < need else 0
        if tail + skip + need - head > self.cap:
            return False
        if skip:
            _U32.pack_into(buf, HEADER + off, WRAP)
            off = 0
        at = HEADER + off
        _U32.pack_into(buf, at, n)
        buf[at + 4:at + 4 + n] = frame
        words[_TAIL] = tail + skip + need  # publish: after the bytes it covers
        return True

    # ---- consumer --------------------------------------------------------------------------
    def take(self, limit: int = 1 << 30) -> list[bytes]:
        """Every frame written and not yet taken (at most `limit`), oldest first."""
        buf, words = self.buf, self.words
        tail, head = words[_TAIL], words[_HEAD_WORD]
        if tail - head > self.cap or tail < head:
            raise RingError(f"ring counters out of range (head {head}, tail {tail})")
        out: list[bytes] = []
        while head < tail and len(out) < limit:
            off = head & self.mask  # a multiple of 8: room for at least a WRAP word
            n = _U32.unpack_from(buf, HEADER + off)[0]
            if n == WRAP:
                if head + self.cap - off >= tail:  # a wrap is always followed by its record
                    raise RingError(f"ring wrap at {head} runs past what was written")
                head += self.cap - off
                continue
            need = _padded(n)
            if n > self.max_frame or off + need > self.cap or head + need > tail:
                raise RingError(f"ring record of {n} bytes at {head} runs past what was written")
            at = HEADER + off + 4
            out.append(bytes(buf[at:at + n]))
            head += need
        words[_HEAD_WORD] = head  # free: after the bytes were copied out
        return out

    def empty(self) -> bool:
        return self.words[_TAIL] == self.words[_HEAD_WORD]
