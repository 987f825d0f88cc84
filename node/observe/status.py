"""The METADATA status trailer a node adds when asked (`dledger top`, `health`, `metadata`).

Why here and not in the handler: the handler answers METADATA but should only gain one call;
everything the trailer holds is already in the shared block or the store directory, read when
a tool asks (about once a second per node), never on the append path.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ipc import protocol as P
from node.block.shared_state import SharedState, monotonic_ms
from node.store.layout import DATA_DIR, INDEX_DIR


def store_bytes(store_dir: str | os.PathLike[str]) -> int:
    """Bytes the store's segment files take on disk (allocated blocks, not apparent size:
    files are preallocated, so this is what the disk lost)."""
    total = 0
    for sub in (DATA_DIR, INDEX_DIR):
        try:
            with os.scandir(Path(store_dir) / sub) as it:
                for e in it:
                    try:
                        total += e.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        pass  # deleted by retention while listing
        except OSError:
            pass
    return total


@functools.cache
def software_version() -> str:
    """The installed dledger-py version ("0+unknown" from a checkout never installed)."""
    from importlib import metadata

    try:
        return metadata.version("dledger-py")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def node_status(state: SharedState, store_dir: str | os.PathLike[str], disk_ratio: float) -> P.NodeStatus:
    """This node's status trailer: version, disk, last leader change, applied index, bytes
    written, and the append-latency histogram's bucket counts (tools difference two answers)."""
    changed = state.get("last_leader_change_ms")
    spec, counts, _total = state.read_histogram("append_latency_ms")
    return P.NodeStatus(software_version(), store_bytes(store_dir), disk_ratio,
                        monotonic_ms() - changed if changed > 0 else -1,
                        state.get("applied_index"), state.get("ledger_end_pos"), tuple(counts))
