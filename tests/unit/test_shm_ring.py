"""ipc/shm_ring.py: the local link's single-producer, single-consumer ring, driven with random
frame sizes against a plain FIFO, at its edges (wrap, full, the frame limit), and with its
memory damaged the way a broken or hostile peer could (RingError, never an over-read)."""

from __future__ import annotations

import random
from collections import deque

import pytest

from ipc.shm_ring import HEADER, WRAP, Ring, RingError, ring_size

CAP = 4096


def _pair(cap: int = CAP) -> tuple[Ring, Ring, bytearray]:
    mem = bytearray(ring_size(cap))
    producer = Ring(memoryview(mem), init_capacity=cap)
    consumer = Ring(memoryview(mem))  # the other process attaches to formatted memory
    return producer, consumer, mem


@pytest.mark.parametrize("seed", range(20))
def test_random_traffic_comes_out_in_order_and_whole(seed: int) -> None:
    rng = random.Random(seed)
    p, c, _ = _pair()
    model: deque[bytes] = deque()
    sent = got = 0
    for _ in range(3000):
        if rng.random() < 0.55:
            frame = rng.randbytes(rng.choice((0, 1, 7, 8, 9, 100, rng.randrange(p.max_frame + 1))))
            if p.put(frame):
                model.append(frame)
                sent += 1
            else:
                assert len(model) > 0  # only a ring holding something can be full
        else:
            for frame in c.take(rng.choice((1, 3, 1 << 30))):
                assert frame == model.popleft()
                got += 1
    for frame in c.take():
        assert frame == model.popleft()
        got += 1
    assert not model and got == sent > 500
    assert c.empty()


def test_an_empty_ring_takes_any_frame_up_to_the_limit_even_across_the_end() -> None:
    p, c, _ = _pair()
    for _ in range(2):
        assert p.put(b"a" * 1500)
        assert c.take() == [b"a" * 1500]
    # the next record does not fit before the end: a WRAP word, then the record at 0
    assert p.put(b"b" * p.max_frame)
    assert c.take() == [b"b" * p.max_frame]
    with pytest.raises(ValueError, match="exceeds"):
        p.put(b"c" * (p.max_frame + 1))


def test_a_full_ring_refuses_until_the_consumer_frees_room() -> None:
    p, c, _ = _pair()
    n = 0
    while p.put(b"x" * 100):
        n += 1
    assert n == CAP // 104  # 4-byte length + 100, padded to 104
    assert len(c.take(1)) == 1
    assert p.put(b"x" * 100)


def test_memory_that_is_not_a_ring_is_refused() -> None:
    with pytest.raises(RingError, match="not a ring"):
        Ring(memoryview(bytearray(ring_size(CAP))))
    _, _, mem = _pair()
    with pytest.raises(RingError, match="capacity"):
        Ring(memoryview(mem)[:ring_size(CAP) - 1])


def test_a_damaged_length_or_counter_is_an_error_not_an_over_read() -> None:
    p, c, mem = _pair()
    assert p.put(b"hello")
    mem[HEADER:HEADER + 4] = (CAP).to_bytes(4, "little")  # a length past what was written
    with pytest.raises(RingError, match="runs past"):
        c.take()
    p, c, mem = _pair()
    mem[64:72] = (CAP * 3).to_bytes(8, "little")  # a tail more than a ring ahead of the head
    with pytest.raises(RingError, match="out of range"):
        c.take()
    p, c, mem = _pair()
    assert p.put(b"x")
    mem[HEADER:HEADER + 4] = WRAP.to_bytes(4, "little")  # a wrap where there is room: skips to 0
    with pytest.raises(RingError, match="wrap"):
        c.take()
