"""What several of the handler's parts share: the response code of a failed store write."""

from __future__ import annotations

import errno

from node.store.base import StoreError

DISK_CODES = frozenset({"DISK_FULL", "DISK_ERROR"})


def store_error_code(e: BaseException) -> str:
    """The response-code name for a failed store operation: a StoreError names its own; a bare
    OSError that escaped the store is DISK_FULL for ENOSPC/EDQUOT, DISK_ERROR otherwise."""
    if isinstance(e, StoreError):
        return e.code_name
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "DISK_FULL"
    return "DISK_ERROR"
