"""Role-change listeners for code that embeds a node (DLedger's RoleChangeHandler).

A broker using the log as its storage must switch between master and slave when its node's
role changes. Two ways to hear about it:

* `--on-role-change CMD` (config `on_role_change`): the elector runs CMD (split like a shell
  would, but no shell) on every transition with DLEDGER_NODE, DLEDGER_GROUP, DLEDGER_ROLE
  (LEADER/FOLLOWER/CANDIDATE), DLEDGER_TERM and DLEDGER_LEADER in its environment.
* `RoleChangeListener(store_dir)`: subscribes, from any process on the machine, to the
  elector's role channel of the node running on `store_dir` and yields `RoleChange`s. Each
  event is a hint sent after the change is durable and in the shared block; `current()`
  reads the truth (the node's METADATA) when a consumer starts or suspects it missed one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zmq

from ipc.codes import Role
from node.wiring.channels import ROLE, decode_role_msg, open_channel


@dataclass(frozen=True, slots=True)
class RoleChange:
    role: Role
    term: int
    leader_slot: int
    epoch: int


class RoleChangeListener:
    def __init__(self, store_dir: str | Path, ctx: zmq.Context | None = None) -> None:
        info = json.loads((Path(store_dir) / "run.json").read_text(encoding="utf-8"))
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.sock = open_channel(self.ctx, info["run_dir"], ROLE, "listener")

    def events(self, timeout_s: float | None = None) -> Iterator[RoleChange]:
        """Yield role changes as they happen; stop after `timeout_s` without one (None: never)."""


        while True:
            if not self.sock.poll(None if timeout_s is None else int(timeout_s * 1000)):
                return
            got = decode_role_msg(self.sock.recv())
            if got is not None:
                yield RoleChange(*got)

    def close(self) -> None:
        self.sock.close(linger=0)
        if self._own_ctx:
            self.ctx.destroy(linger=0)

    def __enter__(self) -> RoleChangeListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
