"""Session sequence-number arithmetic, shared by both ends of the wire.

A client session stamps each append with a 32-bit seq that wraps at 2**32; seqs are compared
in serial-number arithmetic (RFC 1982): `b` is after `a` when ``0 < (b - a) mod 2**32 < 2**31``.
A client never has 2**31 appends in flight, so that order is exact. The client (stamping,
resending behind a gap) and the leader's session table (node/core/sessions.py) must agree on
it bit for bit, so it lives here, on the wire side, and the node imports it.
"""

from __future__ import annotations

SEQ_MASK = 0xFFFF_FFFF
SEQ_HALF = 1 << 31


def seq_add(seq: int, k: int) -> int:
    """`seq` + `k` in the 32-bit sequence space."""
    return (seq + k) & SEQ_MASK


def seq_after(a: int, b: int) -> int:
    """How far `b` is after `a` (0 if equal, negative if before), serial-number arithmetic."""
    d = (b - a) & SEQ_MASK
    return d - (1 << 32) if d >= SEQ_HALF else d
