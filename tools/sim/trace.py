"""The trace: every event a seed produces, the last `trace_len` kept for a failure's report
and all of them hashed (`SimConfig.hash_trace`), so a replay can be compared event by event.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from ipc import protocol as P
from ipc.codes import ResponseCode as RC
from node.wiring import channels

if TYPE_CHECKING:
    from tools.sim.world import Sim


class TraceMixin:
    """`Sim`'s trace: needs `now`, `trace` (a bounded deque), `hash`, `events` and `_tmp`."""

    def trace_event(self, key: str, kind: str, data: Any) -> None:
        ev = (self.now, key, kind, data)
        self.trace.append(ev)
        self.events += 1
        if self.hash is not None:  # the temporary directory's name is the one random thing
            self.hash.update(repr(ev).replace(self._tmp, "TMP").encode())

    def trace_in(self, key: str, kind: str, payload: Any) -> None:
        self.trace_event(key, "<" + kind, payload)

    def format_trace(self) -> str:
        lines = []
        for t, key, kind, data in self.trace:
            if kind == "log":
                level, msg, args = data
                try:
                    text = msg % args
                except Exception:  # noqa: BLE001
                    text = f"{msg} {args}"
                lines.append(f"{t:>7} {key:<12} log {level} {text}")
            elif kind.startswith("<") or kind in ("drop", "send>"):
                lines.append(f"{t:>7} {key:<12} {kind:<8} {_fmt_payload(kind.lstrip('<'), data)}")
            else:
                lines.append(f"{t:>7} {key:<12} {kind:<8} {data}")
        return "\n".join(lines)


def _summ(msg: Any) -> str:
    """A one-line view of a decoded protocol message, without payload bytes."""
    name = type(msg).__name__
    parts = []
    for k in getattr(msg, "__slots__", ()):
        if k in ("group", "entries", "index_records", "body", "bodies", "positions", "reason"):
            if k == "bodies":
                parts.append(f"n={len(msg.bodies)}")
            elif k == "entries" and len(msg.entries):
                parts.append(f"entries={len(msg.entries)}B")
            elif k == "reason" and msg.reason:
                parts.append(f"reason={msg.reason[:60]!r}")
            continue
        v = getattr(msg, k)
        if k == "code":
            with contextlib.suppress(ValueError):
                v = RC(v).name
        elif k == "kind":
            v = getattr(v, "name", v)
        elif isinstance(v, memoryview):  # a result or answer: its repr names an address
            v = f"{len(v)}B"
        elif isinstance(v, list) and any(isinstance(x, memoryview) for x in v):
            v = [f"{len(x)}B" if isinstance(x, memoryview) else x for x in v]
        parts.append(f"{k}={v}")
    return f"{name}({', '.join(parts)})"


def _fmt_payload(kind: str, payload: Any) -> str:
    try:
        if isinstance(payload, tuple) and len(payload) == 2 and isinstance(payload[1], bytes | bytearray):
            return _summ(P.decode(payload[1]))
        if isinstance(payload, bytes | bytearray) and kind in ("reply", "resp", "ctlreply"):
            return _summ(P.decode(payload))
        if kind == "results":
            got = channels.decode_results(payload)
            if got is not None:
                return f"results {got[0]}..{got[0] + len(got[1]) - 1}"
        if kind in ("query", "qreply"):
            frame = payload[1] if kind == "query" else payload
            q = channels.decode_query(frame) if kind == "query" else channels.decode_query_reply(frame)
            return f"tag={q[0]} " + (f"read_index={q[1]}" if kind == "query" else f"status={q[1]} applied={q[2]}")
        if kind == "role":
            r = channels.decode_role_msg(payload)
            if r is not None:
                return f"{r[0].name} term={r[1]} leader=n{r[2]} epoch={r[3]}"
    except Exception:  # noqa: BLE001 - a trace line must never fail
        pass
    return repr(payload)[:120]



class _TraceLogs(logging.Handler):
    """Library loggers (the store's recovery, ...) go into the running seed's trace, not to stderr."""

    def __init__(self, sim: Sim) -> None:
        super().__init__()
        self.sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        s = self.sim
        if record.levelno >= logging.INFO:
            if isinstance(record.msg, str) and "opened in %" in record.msg:
                return  # the store's wall-clock open time: not part of a replayable trace
            s.trace_event(record.name.rsplit(".", 1)[-1], "log", (record.levelname[0], record.msg, record.args))
            if isinstance(record.msg, str) and record.msg.startswith("resuming install"):
                s.stats["install_resumes"] += 1  # a receiver reopened a partial install (restart)


def capture_logs(sim: Sim) -> Any:
    """Send the `dledger` loggers into `sim`'s trace; return the function that undoes it."""
    lg = logging.getLogger("dledger")
    h = _TraceLogs(sim)
    saved = (lg.propagate, lg.level)
    lg.addHandler(h)
    lg.propagate = False
    lg.setLevel(logging.INFO)

    def undo() -> None:
        lg.removeHandler(h)
        lg.propagate, lg.level = saved[0], saved[1]
    return undo
