"""The node's one path for a damaged committed entry, wherever it is found.

Damage in the committed range of the log can be found at three places: recovery at open (the
tail from the checkpoint's committed entry on), the handler's scrub of the entries recovery
left unchecked (`SegmentStore.scrub_step`), and a read of such an entry (the handler's GET, a
dispatcher about to push it). All of them call `store_damaged` with the store's
`StoreCorruptError` (`SegmentStore.committed_damage`: it names the store, the entry and what
is wrong), so what the node does about damage is decided here and only here.

Today: the node stops (`RoleContext.fatal`: one line, exit 1, no restart loop) — a replica
with a damaged committed entry must not serve, vote on or push it, and an operator restores it
from a healthy peer (docs/operations.md).
"""

from __future__ import annotations

from typing import NoReturn

from node.roles.runtime import RoleContext
from node.store.base import StoreError


def store_damaged(rc: RoleContext, err: StoreError) -> NoReturn:
    """Act on a damaged committed entry (or a checkpoint the log does not reach) that `rc`'s
    role found in the node's store: the one place that decides what the node does then."""
    rc.fatal(f"store {rc.cfg.store_dir} refuses to serve a damaged log: {err}")
