"""One declared block protocol (node/block/state_protocol.py), held against both implementations.

The production block (SharedState) and the in-memory one the unit tests and the simulator use
(MemoryState) must offer every protocol method with the same parameters, and behave the same on
the same writes; and role code may call on its block only what the protocol declares.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipc.codes import Role
from node.block import shared_state as ss
from node.block.memory_state import MemoryState
from node.block.shared_state import SharedState
from node.block.state_protocol import StateBlock
from tools.sim.state import SimState

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


def _protocol_members() -> list[str]:
    return sorted(n for n in vars(StateBlock) if not n.startswith("_") and callable(vars(StateBlock)[n]))


def _shape(fn: object) -> list[tuple[str, object, bool]]:
    """(name, kind, has a default) per parameter, self left out."""
    ps = list(inspect.signature(fn).parameters.values())[1:]
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty) for p in ps]


@pytest.mark.parametrize("impl", [SharedState, MemoryState, SimState], ids=lambda c: c.__name__)
def test_every_protocol_method_exists_with_the_same_parameters(impl: type) -> None:
    members = _protocol_members()
    assert len(members) >= 20, members  # the protocol was read, not an empty class
    for name in members:
        assert hasattr(impl, name), f"{impl.__name__} lacks {name}()"
        assert _shape(getattr(impl, name)) == _shape(getattr(StateBlock, name)), \
            f"{impl.__name__}.{name}{inspect.signature(getattr(impl, name))} differs from the " \
            f"protocol's {inspect.signature(getattr(StateBlock, name))}"


def test_a_memory_state_is_a_state_block() -> None:
    assert isinstance(MemoryState(), StateBlock)


@pytest.fixture
def shared() -> Iterator[SharedState]:
    name = f"dl_p{os.getpid()}_{next(_names)}"
    st = SharedState.create(name, n_peers=3, self_slot=1)
    try:
        yield st
    finally:
        st.unlink()
        st.close()
        if (Path("/dev/shm") / name).exists():
            ss._unlink_raw(name)


def _script(b: StateBlock) -> list[object]:
    """The same writes on either block; what each read then gave."""
    seen: list[object] = [b.read_member(), b.read_ledger(), b.read_quorum(), b.read_snapshot(),
                          b.read_peer(0).match_index, b.get("repair_index"), b.n_peers, b.self_slot]
    seen.append(b.write_member(role=Role.CANDIDATE, current_term=1))  # term moved: epoch + 1
    seen.append(b.write_member(last_quorum_heartbeat_ms=5))  # neither moved: epoch kept
    seen.append(b.write_member(role=Role.LEADER, leader_slot=1))
    seen.append(b.read_member())
    seen.append(b.write_ledger(ledger_end_index=4, ledger_end_term=1))  # others kept
    seen.append(b.write_ledger(committed_index=3))
    seen.append(b.read_ledger())
    seen += [b.get("current_term"), b.get("role_epoch"), b.get("committed_index"), b.get("n_peers"),
             b.get("self_slot")]
    seen.append(b.write_quorum(quorum_index=3, quorum_term=1))
    seen.append(b.write_snapshot(snapshot_index=2, snapshot_term=1))
    b.write_peer(0, match_index=3, match_term=1, alive=True)
    b.write_peer(0, last_ack_ms=9)
    seen.append(b.read_peer(0))
    seen.append([(p.slot, p.match_index) for p in b.read_peers()])
    seen.append(b.incr("entries_appended", 2))
    seen.append(b.incr("entries_appended"))
    b.set("pending_appends", 7)
    b.word_writer("ledger_end_pos")(11)
    seen += [b.get("entries_appended"), b.get("pending_appends"), b.get("ledger_end_pos")]
    seen.append(b.incr_peer(0, "pushes_sent", 3))
    b.set_peer(0, "match_pos", 40)
    seen += [b.get_peer(0, "pushes_sent"), b.get_peer(0, "match_pos"), b.get_peer(0, "match_index")]
    b.beat("handler", 123)
    b.beat("dispatcher[0]", 456)
    seen += [b.last_beat("handler"), b.last_beat("dispatcher[0]"), b.get_peer(0, "beat_ms"), b.read_peer(0),
             b.read_peers()]
    b.histogram_writer("append_latency_ms").observe(3)
    b.request_counter()
    for bad in (lambda: b.get("no_such_word"), lambda: b.incr("no_such_word"), lambda: b.set("no_such_word", 1),
                lambda: b.incr_peer(0, "no_such_word"), lambda: b.histogram_writer("no_such")):
        with pytest.raises(KeyError):
            bad()
    with pytest.raises(ValueError):
        b.set("committed_index", 1)  # a group field: only its write_*() may change it
    return seen


def test_memory_state_behaves_as_the_shared_block(shared: SharedState) -> None:
    assert _script(MemoryState(3, 1)) == _script(shared)


def _block_calls(path: Path) -> set[str]:
    """Methods called on something named ``state`` (``state.x()``, ``self.state.x()``,
    ``rc.state.x()``, ``self.rc.state.x()``) in one module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            recv = node.func.value
            name = recv.attr if isinstance(recv, ast.Attribute) else getattr(recv, "id", "")
            if name == "state":
                out.add(node.func.attr)
    return out


def test_roles_call_only_what_the_protocol_declares() -> None:
    """The supervisor owns the block's lifecycle (create, unlink): it alone may use more."""
    files = [p for p in sorted((ROOT / "node" / "roles").rglob("*.py")) if p.name != "supervisor.py"]
    files.append(ROOT / "node" / "observe" / "role_metrics.py")
    declared = set(_protocol_members())
    used = {p.relative_to(ROOT).as_posix(): _block_calls(p) for p in files}
    assert sum(map(len, used.values())) >= 20, used  # the scan sees the roles' calls
    undeclared = {f: sorted(c - declared) for f, c in used.items() if c - declared}
    assert not undeclared, f"block methods the protocol does not declare: {undeclared}"
