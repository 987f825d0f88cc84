"""The slot table file's "did it move" check, modelled in memory while a simulation runs.

Every role of a real node stats RUN_DIR/slots.json once a loop turn (`SlotFile.changed`: inode,
mtime, size) to notice that another process rewrote it; the simulator's supervisors
(`Sim.follow_slots`) do the same after every step. In the simulator every writer of the file is
in this process and goes through `SlotFile._write`, so a version counter per file, bumped on
each write, says exactly what the stat says -- without the ~15% of a `join` seed's CPU the
stat calls cost. The file itself is still written and read as on a real node.

`install()` patches `SlotFile` while at least one `Sim` is alive (counted: nested or
sequential simulations in one test process each install and remove it); outside a
simulation the real stat is back, so tests of the file itself see a real file system.
"""

from __future__ import annotations

from typing import Any

from node.wiring.slot_file import SlotFile

_cells: dict[str, list[int]] = {}  # path -> [version]
_users = 0
_real: tuple[Any, Any] | None = None


def _cell(f: SlotFile, create: bool = False) -> list[int] | None:
    """The file's version cell, kept on the handle after the first lookup; `create` makes
    one (version 0) for a file this simulation has not counted yet."""
    c = f.__dict__.get("_sim_cell")
    if c is None:
        key = str(f.path)
        c = _cells.setdefault(key, [0]) if create else _cells.get(key)
        if c is not None:
            f.__dict__["_sim_cell"] = c
    return c


def _stamp(f: SlotFile) -> tuple[int, ...] | None:
    c = _cell(f)
    if c is None:  # never written in this simulation: ask the file system once it exists
        assert _real is not None
        if _real[0](f) is None:
            return None
        c = _cell(f, create=True)
    return (c[0],)


def _write(f: SlotFile, table: Any) -> None:
    c = _cell(f, create=True)
    c[0] += 1  # before the write: the writer's own stamp (taken inside it) is the new version
    assert _real is not None
    _real[1](f, table)


def install() -> None:
    global _users, _real
    if _users == 0:
        _real = (SlotFile._current_stamp, SlotFile._write)
        SlotFile._current_stamp = _stamp  # type: ignore[method-assign]
        SlotFile._write = _write  # type: ignore[method-assign]
    _users += 1


def uninstall(under: str) -> None:
    """One simulation is done: forget its files (paths under `under`); the last one restores
    the real `SlotFile`."""
    global _users, _real
    for p in [p for p in _cells if p.startswith(under)]:
        del _cells[p]
    _users -= 1
    if _users == 0 and _real is not None:
        SlotFile._current_stamp, SlotFile._write = _real  # type: ignore[method-assign]
        _real = None
