"""Requests answered on the data port, by request type and response code, in the state block.

Why a matrix of plain counters: `dledger_requests_total{type, code}` must come from the handler
without a lock or a message per reply, and be readable by the supervisor at scrape time. The
handler is the only writer of the matrix (every reply leaves through its `_reply`), so each
count is one dict lookup pair and one read-add-store. Types and codes outside the declared
lists land in an ``OTHER`` row/column rather than being lost.
"""

from __future__ import annotations

from typing import Final

from ipc.codes import MsgType, ResponseCode

REQUEST_TYPES: Final = (MsgType.APPEND, MsgType.BATCH_APPEND, MsgType.GET, MsgType.METADATA,
                        MsgType.LEADERSHIP_TRANSFER, MsgType.PUSH, MsgType.OPEN_SESSION,
                        MsgType.QUERY, MsgType.SNAPSHOT, MsgType.INSTALL)
RESPONSE_CODES: Final = tuple(ResponseCode)
TYPE_NAMES: Final = tuple(t.name for t in REQUEST_TYPES) + ("OTHER",)
CODE_NAMES: Final = tuple(c.name for c in RESPONSE_CODES) + ("OTHER",)
N_TYPES: Final = len(TYPE_NAMES)
N_CODES: Final = len(CODE_NAMES)
WORDS: Final = N_TYPES * N_CODES
_ERROR = int(MsgType.ERROR_RESPONSE)


def request_type_of(msg_type: int, request_type: int = 0) -> int:
    """The request type a reply answers: an ERROR names it, a typed reply is request | 0x80."""
    return request_type if msg_type == _ERROR else msg_type & 0x7F


class RequestCounter:
    """The matrix bound to its words in a block's ``memoryview.cast("q")`` (the handler's)."""

    __slots__ = ("_w", "_base", "_rows", "_cols", "_other_row", "_other_col", "_class_rows")

    def __init__(self, words: memoryview, base_word: int) -> None:
        self._w = words
        self._base = base_word
        self._rows = {int(t): i * N_CODES for i, t in enumerate(REQUEST_TYPES)}
        self._cols = {int(c): i for i, c in enumerate(RESPONSE_CODES)}
        self._other_row = (N_TYPES - 1) * N_CODES
        self._other_col = N_CODES - 1
        self._class_rows: dict[type, int] = {}  # reply class -> its row (not for ERROR replies)

    def count(self, request_type: int, code: int) -> None:
        """One reply to a request of ``request_type`` with response code ``code``."""
        i = (self._base + self._rows.get(request_type, self._other_row)
             + self._cols.get(code, self._other_col))
        self._w[i] = self._w[i] + 1

    def count_reply(self, msg: object) -> None:
        """One reply message (anything with ``TYPE`` and ``code``; ERRORs name their request).
        Each reply class's row is cached (-1 for ERROR, whose row is the request it names): this
        runs once per reply on the handler's path."""
        cls = type(msg)
        row = self._class_rows.get(cls)
        if row is None:
            t = int(msg.TYPE)  # type: ignore[attr-defined]
            row = -1 if t == _ERROR else self._rows.get(t & 0x7F, self._other_row)
            self._class_rows[cls] = row
        if row < 0:  # an ERROR: the row of the request it names
            row = self._rows.get(msg.request_type, self._other_row)  # type: ignore[attr-defined]
        i = self._base + row + self._cols.get(msg.code, self._other_col)  # type: ignore[attr-defined]
        self._w[i] = self._w[i] + 1


def nonzero(counts: tuple[int, ...] | list[int]) -> list[tuple[str, str, int]]:
    """(type, code, count) for every non-zero cell of a matrix read from the block."""
    out = []
    for i, v in enumerate(counts):
        if v:
            out.append((TYPE_NAMES[i // N_CODES], CODE_NAMES[i % N_CODES], v))
    return out
