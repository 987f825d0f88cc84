"""The node's channels, declared once: endpoints, socket types, who binds, message formats.

`shared_state.py` declares the block every role reads; this module declares every socket a role
opens, so no role module imports another to find a peer's endpoint or a message layout (the
roles are separate processes: what they share is this contract, not code).

Wake-up channels carry hints only. The truth is in the shared block and the store, so a lost or
duplicated wake-up costs latency, never correctness (SPEC §2).

| channel | endpoint | binder (type) | connectors (type) | message |
|---|---|---|---|---|
| data port | tcp host:port | handler (ROUTER) | clients, peers' dispatchers (DEALER) | `ipc.protocol` frames |
| elector port | tcp host:port+1 | elector (ROUTER) | peers' electors (DEALER) | `ipc.protocol` VOTE / HEARTBEAT / TAKE_LEADERSHIP |
| role | ipc elector.pub | elector (PUB) | every role (SUB) | `ROLE_MSG`: role, term, leader slot, role epoch |
| control | ipc elector.ctl | elector (ROUTER) | handler (DEALER) | `ipc.protocol` LEADERSHIP_TRANSFER (answered with TRANSFER_RESPONSE), or `CONFIRM_LEADERSHIP` (no answer: the block's quorum-heartbeat time is the answer) |
| appended | ipc appended.pub | handler (PUB) | dispatchers, ack checker (SUB, conflated) | ASCII ledger end index |
| ack | ipc ack.pull | ack checker (PULL) | dispatchers (PUSH) | `ACK_MSG`: peer slot, match index |
| commit | ipc commit.pull | handler (PULL) | ack checker (PUSH) | `COMMIT_MSG` |
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from ipc.codes import Role
from ipc.sockets import ipc_path


@dataclass(frozen=True, slots=True)
class Channel:
    """One in-node channel: `name` is its ipc:// socket file under the run directory."""

    name: str
    binder: str
    bind_type: str
    connect_type: str


ROLE = Channel("elector.pub", "elector", "PUB", "SUB")
CONTROL = Channel("elector.ctl", "elector", "ROUTER", "DEALER")
APPENDED = Channel("appended.pub", "handler", "PUB", "SUB")
ACK = Channel("ack.pull", "ack_checker", "PULL", "PUSH")
COMMIT = Channel("commit.pull", "handler", "PULL", "PUSH")
ALL = (ROLE, CONTROL, APPENDED, ACK, COMMIT)


def endpoint(run_dir: str | Path, channel: Channel) -> str:
    """The ipc:// address of `channel` for the node whose run directory is `run_dir`."""
    return ipc_path(run_dir, channel.name)


# ---- role ------------------------------------------------------------------------------------
ROLE_TOPIC = b"role"
ROLE_MSG = struct.Struct(">4sBqqq")  # topic, role, term, leader slot, role epoch


def encode_role_msg(role: Role, term: int, leader_slot: int, epoch: int) -> bytes:
    return ROLE_MSG.pack(ROLE_TOPIC, int(role), term, leader_slot, epoch)


def decode_role_msg(frame: bytes) -> tuple[Role, int, int, int] | None:
    """(role, term, leader slot, role epoch), or None for anything that is not a role message."""
    if len(frame) != ROLE_MSG.size:
        return None
    _t, role, term, leader, epoch = ROLE_MSG.unpack(frame)
    try:
        return Role(role), term, leader, epoch
    except ValueError:
        return None


# ---- control ---------------------------------------------------------------------------------
CONFIRM_LEADERSHIP = b"confirm"
"""Handler → elector: start a heartbeat round now (a linearizable read waits for a quorum round
that began after it arrived; the elector publishes that round's start time in the block)."""

# ---- ack / commit ----------------------------------------------------------------------------
ACK_MSG = struct.Struct(">qq")  # peer slot, match index: a hint for the ack checker
COMMIT_MSG = b"c"


def encode_appended(ledger_end_index: int) -> bytes:
    return b"%d" % ledger_end_index
