"""Log line formats shared by the CLI, the supervisor and every role process of a node.

Its own module, importing nothing heavy, because `tools.cli` sets up logging for every
subcommand and `dledger dump` must not pay for zmq to do so. Text lines keep the shape they
always had (`TIME LEVEL NODE ROLE[PID] LOGGER: MESSAGE`) with an ISO 8601 time that carries
its UTC offset; JSON lines are one object each, for log shippers.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

class _IsoFormatter(logging.Formatter):
    """Text lines with an ISO 8601 timestamp carrying its UTC offset: logs of nodes in several
    time zones (or read after a DST change) still sort and compare."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return _iso(record.created)


def _iso(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).astimezone().isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per line (`ts`, `level`, `node`, `role`, `pid`, `logger`, `msg`, `exc`), for
    log shippers that would otherwise have to parse our text lines with a regex."""

    def __init__(self, node: str = "", role: str = "") -> None:
        super().__init__()
        self.node, self.role = node, role

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": _iso(record.created), "level": record.levelname}
        if self.node:
            out["node"] = self.node
        if self.role:
            out["role"] = self.role
        out.update(pid=record.process, logger=record.name, msg=record.getMessage())
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str = "info", fmt: str = "text", node: str = "", role: str = "",
                      debug: bool = False, force: bool = True) -> None:
    """The one logging set-up of the CLI, the supervisor and every role process, so all lines
    of a node look alike whatever process wrote them. `debug` (`--debug`) wins over `level`.
    `force=False` leaves an existing set-up alone (the CLI called from a program or a test)."""
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter(node, role)
    else:
        who = f"{node} {role}[%(process)d] " if node or role else ""
        formatter = _IsoFormatter(f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    name = "debug" if debug else (level if level in LOG_LEVELS else "info")
    logging.basicConfig(level=getattr(logging, name.upper()), handlers=[handler], force=force)
