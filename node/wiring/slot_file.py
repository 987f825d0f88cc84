"""The node's peer slot table, shared by its roles through a file in the run directory
(docs/membership.md "Processes").

Who owns which slot of the state block (node/core/slots.py) changes when a configuration
adds or removes a member. Every role that maps a slot to a member reads the same table: the
handler (a leader slot to an id), the elector (ids to slots and addresses), the supervisor
(one dispatcher per held slot), retention and the metrics. The table is variable-length text
(ids, hosts), so it lives in `RUN_DIR/slots.json`, not in the seqlocked block.

Two writers, one lock: the handler assigns slots when it publishes a configuration
(`node.core.slots.assign`), the supervisor releases a leaving slot once its dispatcher stopped
(`node.core.slots.release`). Each does read-modify-write under an exclusive `flock` on
`RUN_DIR/slots.lock`, so neither loses the other's change, and a release re-checks, under the
lock, that the slot is still leaving (a member added back meanwhile took it back).

The invariant the counting roles rely on: **the handler writes the table before it publishes
a configuration whose masks name a new slot**, so a role that sees the masks move and then
reads the file finds every slot the masks name. Readers never lock: the file is replaced
whole (temporary file, rename), so a read sees one version or the next, never a mix; a role
re-reads when the file's identity (inode, mtime, size) moved, a `stat` per check.

The file is the node's run state, not durable: the supervisor writes the bootstrap table
(the `--peers` positions) when it starts, and the handler assigns the newest configuration's
members from there, as a node that starts fresh would.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from node.core.slots import SlotTable

SLOTS_FILE = "slots.json"
LOCK_FILE = "slots.lock"


class SlotFileError(RuntimeError):
    """The table cannot be read or written (one line: the path and why)."""


class SlotFile:
    """One process's handle on the table (module docstring)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / SLOTS_FILE
        self.lock_path = Path(run_dir) / LOCK_FILE
        self._stamp: tuple[int, int, int] | None = None
        self.table: SlotTable | None = None  # as last read or written by this process

    def _current_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def changed(self) -> bool:
        """True when the file moved since this process last read or wrote it."""
        return self._current_stamp() != self._stamp

    def read(self) -> SlotTable | None:
        """The table (None while no file exists). Raises SlotFileError on a damaged one."""
        stamp = self._current_stamp()
        if stamp is None:
            self._stamp, self.table = None, None
            return None
        try:
            with open(self.path, encoding="utf-8") as f:
                table = SlotTable.from_json(json.load(f)["owners"])
        except FileNotFoundError:
            return self.read()  # replaced between the stat and the open: read the new one
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SlotFileError(f"{self.path}: cannot read the slot table: {e}") from None
        self._stamp, self.table = stamp, table
        return table

    def refresh(self) -> SlotTable | None:
        """The table, re-read only if the file moved (a stat otherwise)."""
        return self.read() if self.changed() else self.table

    def _write(self, table: SlotTable) -> None:
        tmp = self.path.with_name(f".{SLOTS_FILE}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps({"owners": table.to_json()}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise SlotFileError(f"{self.path}: cannot write the slot table: {e}") from None
        self._stamp, self.table = self._current_stamp(), table

    def update(self, fn: Callable[[SlotTable | None], SlotTable]) -> SlotTable:
        """Read-modify-write under the lock: `fn` gets the table on file (None: none yet) and
        returns the one to keep (written only if it differs). Exceptions from `fn` propagate
        with nothing written."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise SlotFileError(f"{self.lock_path}: cannot open the slot table's lock: {e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = self.read()
            table = fn(current)
            if table != current:
                self._write(table)
            return table
        finally:
            os.close(fd)  # closing the descriptor drops the lock


class MemorySlots:
    """The same interface for a role without a run directory (unit tests that build a role
    on a bare context): the table lives in this object only."""

    def __init__(self) -> None:
        self.table: SlotTable | None = None

    def changed(self) -> bool:
        return False

    def read(self) -> SlotTable | None:
        return self.table

    refresh = read

    def update(self, fn: Callable[[SlotTable | None], SlotTable]) -> SlotTable:
        self.table = fn(self.table)
        return self.table


def slot_store(run_dir: str | os.PathLike[str] | None) -> SlotFile | MemorySlots:
    """The run directory's table, or an in-memory one where a role has no run directory."""
    return SlotFile(run_dir) if run_dir else MemorySlots()
