"""Names the supervisor and its roles agree on: the fatal exit, where its reason is left, and the
node's state block.

Apart from node/roles/runtime.py (which re-exports them) because the supervisor needs only these,
and runtime imports ZeroMQ, the security module and the store: ~20 ms of CPU at every node start
that the supervisor, which never opens a socket to a role, does not use (docs/performance.md
"Start time").
"""

from __future__ import annotations

import os
from pathlib import Path

from node.block.shared_state import segment_name
from node.config import NodeConfig

EXIT_FATAL = 3
"""A role's exit code for "cannot work, do not restart me": the supervisor stops the node."""
FATAL_FILE_PREFIX = "fatal-"
"""`RUN_DIR/fatal-<role>` holds the one-line reason of a role's fatal stop (RoleContext.fatal)."""


def fatal_file(run_dir: str | os.PathLike[str], role: str) -> Path:
    """Where role `role` ("elector", "dispatcher[2]"...) leaves the reason of its fatal stop."""
    return Path(run_dir) / f"{FATAL_FILE_PREFIX}{role}"


def state_name(cfg: NodeConfig) -> str:
    """The node's shared-memory block: one per (group, id, store directory)."""
    return segment_name(cfg.group, cfg.id, os.path.abspath(cfg.store_dir))
