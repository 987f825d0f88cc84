"""The run directory's slot table (node/wiring/slot_file.py): two writers never lose each
other's change, a reader sees a change by a stat, a damaged file is one clear error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node.core.membership import Change, ChangeKind, apply_change, bootstrap_configuration
from node.core.slots import SlotOwner, SlotTable, assign, bootstrap_slots, release
from node.wiring.slot_file import SlotFile, SlotFileError

PEERS = {"n0": ("127.0.0.1", 20000), "n1": ("127.0.0.1", 20002), "n2": ("127.0.0.1", 20004)}


def _claim(t: SlotTable | None, name: str) -> SlotTable:
    """A writer's read-modify-write: take the lowest free slot for `name`."""
    assert t is not None
    owners = list(t.owners)
    free = owners.index(None)
    owners[free] = SlotOwner(name, "127.0.0.1", 30000 + 2 * free, free)
    return SlotTable(tuple(owners))


def test_two_processes_updating_at_once_lose_nothing(tmp_path: Path) -> None:
    SlotFile(tmp_path).update(lambda _: bootstrap_slots(PEERS))
    pids = []
    for k in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                f = SlotFile(tmp_path)
                for i in range(6):
                    f.update(lambda t, i=i, k=k: _claim(t, f"w{k}-{i}"))
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    t = SlotFile(tmp_path).read()
    assert t is not None
    names = sorted(o.id for _, o in t.held())
    assert names == sorted(["n0", "n1", "n2", *(f"w{k}-{i}" for k in range(2) for i in range(6))])


def test_a_reader_sees_a_change_and_only_rereads_then(tmp_path: Path) -> None:
    writer, reader = SlotFile(tmp_path), SlotFile(tmp_path)
    assert reader.refresh() is None and not reader.changed()
    boot = writer.update(lambda _: bootstrap_slots(PEERS))
    assert reader.changed() and reader.refresh() == boot and not reader.changed()
    c = apply_change(bootstrap_configuration(PEERS), Change(ChangeKind.REMOVE, "n1"), 4)
    leaving = writer.update(lambda t: assign(t, c))
    assert reader.refresh() == leaving and leaving.owners[1].leaving
    assert writer.update(lambda t: release(t, 1)).owners[1] is None
    assert reader.refresh().owners[1] is None


def test_an_unchanged_table_is_not_rewritten(tmp_path: Path) -> None:
    f = SlotFile(tmp_path)
    f.update(lambda _: bootstrap_slots(PEERS))
    before = os.stat(f.path)
    f.update(lambda t: t)
    after = os.stat(f.path)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


@pytest.mark.parametrize("text", ["", "{", '{"owners": 3}', '{"owners": [null]}',
                                  '{"owners": [{"id": "x"}' + ", null" * 15 + "]}"])
def test_a_damaged_table_is_one_clear_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "slots.json").write_text(text)
    with pytest.raises(SlotFileError, match="slots.json: cannot read the slot table"):
        SlotFile(tmp_path).read()


def test_a_failed_update_writes_nothing(tmp_path: Path) -> None:
    f = SlotFile(tmp_path)
    boot = f.update(lambda _: bootstrap_slots(PEERS))

    def boom(_: SlotTable | None) -> SlotTable:
        raise ValueError("no")

    with pytest.raises(ValueError):
        f.update(boom)
    assert SlotFile(tmp_path).read() == boot and not list(tmp_path.glob(".slots.json.*"))
