"""tools/sim/slot_stamps.py: while a simulation runs, a write of the slot table by one
`SlotFile` is seen as a move by every other handle on the same file (what the real stat
gives), and once the last simulation is closed the real `SlotFile` is back."""

from __future__ import annotations

from pathlib import Path

from node.core.slots import bootstrap_slots
from node.wiring.slot_file import SlotFile
from tools.sim import slot_stamps
from tools.sim.world import ALL_FAULTS, Sim, SimConfig


def test_a_write_is_a_move_for_every_handle_and_the_real_stat_comes_back(tmp_path: Path) -> None:
    real = (SlotFile._current_stamp, SlotFile._write)
    table = bootstrap_slots({"n0": ("127.0.0.1", 1), "n1": ("127.0.0.1", 2)})
    slot_stamps.install()
    try:
        writer, reader = SlotFile(tmp_path), SlotFile(tmp_path)
        assert reader.refresh() is None and not reader.changed()  # no file yet
        writer.update(lambda _t: table)
        assert not writer.changed()  # its own write
        assert reader.changed() and reader.refresh() == table and not reader.changed()
        writer.update(lambda _t: bootstrap_slots({"n0": ("127.0.0.1", 1)}))
        assert reader.changed()
        assert SlotFile(tmp_path).refresh() is not None  # a new handle: the file is there
    finally:
        slot_stamps.uninstall(str(tmp_path))
    assert (SlotFile._current_stamp, SlotFile._write) == real


def test_each_simulation_installs_and_removes_it() -> None:
    real = SlotFile._current_stamp
    sim = Sim(SimConfig(seed=3, faults=(*ALL_FAULTS, "membership", "join")))
    try:
        assert SlotFile._current_stamp is not real
        assert sim.nodes[0].slot_file is not None and not sim.nodes[0].slot_file.changed()
    finally:
        sim.close()
    assert SlotFile._current_stamp is real
