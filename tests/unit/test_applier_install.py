"""The applier's half of install snapshot (node/roles/applier.py `on_install_chunk`), driven
in-process with a memory block, a real snapshot directory and the KV state machine."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from node.block.memory_state import MemoryState
from node.config import NodeConfig
from node.roles.applier import Applier
from node.statemachine.snapshot_meta import SnapshotMeta
from node.wiring import channels


class Fatal(Exception):
    pass


@dataclass
class FakeRC:
    cfg: NodeConfig
    state: MemoryState = field(default_factory=MemoryState)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("test.applier"))
    now: int = 1_000

    def clock(self) -> int:
        return self.now

    def wall_clock(self) -> float:
        return 1_700_000_000.0

    def fatal(self, message: str):
        raise Fatal(message)


@dataclass
class Replies:
    frames: list[bytes] = field(default_factory=list)

    def reply(self, ident: bytes, frame: bytes) -> None:
        self.frames.append(frame)

    def results(self, frame: bytes) -> bool:
        return True


def _applier(tmp_path: Path) -> tuple[Applier, Replies]:
    cfg = NodeConfig(id="n0", peers="n0-127.0.0.1:20000", store_dir=str(tmp_path), state_machine="kv")
    ap = Applier(FakeRC(cfg))
    ap.transport = replies = Replies()
    return ap, replies


def _install_chunk(last_index: int) -> bytes:
    meta = SnapshotMeta(last_index=last_index, last_term=1, size=4, crc32c=0, state_machine="kv",
                        created="2026-11-28T00:00:00Z")
    return channels.encode_install_chunk(meta.to_json(), 0, b"")


def test_a_state_past_the_leaders_snapshot_is_made_durable_before_it_answers_installed(tmp_path: Path) -> None:
    """This applier applied up to 1,199 from its old log, its newest snapshot on disk is at
    1,170, and the leader installs its snapshot at 1,199 (the store dropped its trimmed log for
    damage). Answered `installed` at once, the handler reset the log to begin at 1,200 and the
    applier then stopped the node: a restart needs entries from 1,171 (CI met it). The state
    is snapshotted at its applied index first."""
    ap, replies = _applier(tmp_path)
    ap.applied, ap.applied_term, ap.snapshot_index = 1199, 1, 1170
    ap.on_install_chunk(b"h", 7, _install_chunk(1199))
    assert ap.snapshot_index == 1199 and [s.last_index for s in ap.snaps.list()] == [1199]
    reply = channels.decode_query_reply(replies.frames[-1])
    assert reply is not None
    tag, status, _applied, answer = reply
    assert (tag, status) == (7, channels.QUERY_OK)
    _received, installed, index, _term = channels.INSTALL_PROGRESS.unpack(answer)
    assert installed and index == 1199
