"""TEST-ONLY fault hooks the node's transports consult, so an integration test's fault (a lost
push, a cut link) runs through the real code paths of real processes.

Off unless an environment variable turns it on; production never sets these. One module, read
by every process of a node at import, so all of them see the same switches; it is not part of
the wire codec (ipc/protocol.py), which only encodes and decodes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping


class FaultHook:
    """Test-only switches for the integration tests' faults, so a fault runs through the real code
    paths of real processes. Does nothing by default.

    - ``DLEDGER_TEST_DROP_PUSH_EVERY=N``: the dispatcher calls `drop_push()` before sending each
      push; every N-th call returns True and the push is silently not sent (a lost message).
    - ``DLEDGER_TEST_PARTITION_FILE=PATH``: a file listing peer ids (whitespace separated) this
      process must not send to; `blocked(peer)` re-reads it when its mtime changes (checked at
      most every 50 ms). Write both sides' files to cut a link in both directions; delete or
      empty them to heal.
    """

    __slots__ = ("drop_push_every", "partition_file", "_pushes", "_blocked", "_mtime", "_checked")

    def __init__(self, drop_push_every: int = 0, partition_file: str | None = None) -> None:
        self.drop_push_every = max(0, drop_push_every)
        self.partition_file = partition_file or None
        self._pushes = 0
        self._blocked: frozenset[str] = frozenset()
        self._mtime: float | None = None
        self._checked = -1.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> FaultHook:
        raw = environ.get("DLEDGER_TEST_DROP_PUSH_EVERY", "").strip()
        try:
            every = int(raw) if raw else 0
        except ValueError:
            every = 0
        return cls(every, environ.get("DLEDGER_TEST_PARTITION_FILE"))

    @property
    def enabled(self) -> bool:
        return bool(self.drop_push_every or self.partition_file)

    def drop_push(self) -> bool:
        """Call once per push about to be sent; True means: pretend it was lost."""
        if not self.drop_push_every:
            return False
        self._pushes += 1
        return self._pushes % self.drop_push_every == 0

    def blocked(self, peer_id: str) -> bool:
        """True if the partition file currently cuts this process off from `peer_id`."""
        if self.partition_file is None:
            return False
        now = time.monotonic()
        if now - self._checked >= 0.05:
            self._checked = now
            try:
                mtime = os.stat(self.partition_file).st_mtime_ns
            except OSError:
                mtime = None
            if mtime != self._mtime:
                self._mtime = mtime
                try:
                    with open(self.partition_file, encoding="utf-8") as f:
                        self._blocked = frozenset(f.read().split())
                except OSError:
                    self._blocked = frozenset()
        return peer_id in self._blocked


faults = FaultHook.from_env()
"""The process-wide test-only fault hook (inert unless DLEDGER_TEST_* variables are set)."""
