"""Install snapshot, the leader's half, as data (docs/snapshots.md "Install").

A follower that needs entries the leader no longer has (retention deleted them after a
snapshot covered them) receives the leader's newest snapshot instead. `InstallSender` decides
which chunk of it to send next; the dispatcher reads the bytes (`read_chunk`) and sends them
as INSTALL requests. Why this shape rather than DLedger's one message holding the whole file:
a snapshot can be larger than any frame (ours are capped at 64 MiB) and must not sit in memory
on either side, and a dropped connection must not restart the transfer from byte 0.

The rules:
* **Probe first.** A zero-length chunk at offset 0 asks the follower where to resume (its
  receiver keeps a partial install of the same snapshot across dropped connections and
  restarts; node.statemachine.snapshot_install). Nothing else is sent until it is answered.
* **Flow control.** At most `window` chunks of `chunk_bytes` are unanswered at once, so a
  transfer holds at most window × chunk_bytes in the sockets and follower memory, and a slow
  follower disk slows the sender instead of piling up frames.
* **Answers carry progress.** Every answer says how many bytes the follower has in place
  (`received`). A refused chunk (not the next one: a frame lost or reordered, a receiver
  that restarted) rewinds the sender to `received`; refusals of chunks sent before that
  rewind are stale and ignored, so one gap causes one rewind, not one per chunk in flight.
* **Timeouts resume, never restart.** When the oldest unanswered chunk is older than
  `chunk_timeout_ms` the sender probes again: the follower says where it is.
* **Done** when the follower answers `installed`: the snapshot passed its size and checksum
  checks there, replaced the follower's state machine, and the follower's log was reset to
  begin after it. The dispatcher then compares at the snapshot's last index, like any other
  follower (node.core.replication).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_CHUNK_BYTES = 1 << 20  # node.statemachine.snapshot_install.DEFAULT_CHUNK_BYTES
DEFAULT_WINDOW = 4
DEFAULT_CHUNK_TIMEOUT_MS = 5000  # the last chunk's answer waits for the install (verify + restore)


@dataclass(frozen=True, slots=True)
class InstallConfig:
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    window: int = DEFAULT_WINDOW
    chunk_timeout_ms: int = DEFAULT_CHUNK_TIMEOUT_MS


@dataclass(frozen=True, slots=True)
class SendChunk:
    """Send bytes [offset, offset + length) of the snapshot (length 0: the probe at offset 0)."""

    offset: int
    length: int


class InstallSender:
    """One snapshot's transfer to one follower: which chunk next, and what answers mean."""

    def __init__(self, last_index: int, last_term: int, size: int,
                 cfg: InstallConfig | None = None) -> None:
        self.last_index, self.last_term, self.size = last_index, last_term, size
        self.cfg = cfg or InstallConfig()
        self.received = -1  # what the follower has in place; -1: unknown (probe first)
        self.next_offset = 0
        self.inflight: OrderedDict[int, int] = OrderedDict()  # chunk offset → sent ms
        self.done = False
        self.retry_at = -1  # everything was received but not installed: probe again then
        self.rewinds = 0  # refusals and timeouts that moved the sender back (for the log)

    def _probe_again(self) -> None:
        self.received = -1
        self.next_offset = 0  # the answer says where to continue (chunks after it may be lost)
        self.inflight.clear()
        self.rewinds += 1

    def next_action(self, now_ms: int) -> SendChunk | None:
        """The next chunk to send, or None (wait for an answer or a timeout)."""
        if self.done:
            return None
        if self.inflight:
            oldest_sent = next(iter(self.inflight.values()))
            if now_ms - oldest_sent >= self.cfg.chunk_timeout_ms:
                self._probe_again()
        if self.retry_at >= 0 and now_ms >= self.retry_at:
            self.retry_at = -1
            self._probe_again()
        if self.received < 0:
            return None if self.inflight else SendChunk(0, 0)
        if len(self.inflight) >= self.cfg.window or self.next_offset >= self.size:
            return None
        return SendChunk(self.next_offset, min(self.cfg.chunk_bytes, self.size - self.next_offset))

    def sent(self, chunk: SendChunk, now_ms: int) -> None:
        self.inflight[chunk.offset] = now_ms
        if chunk.length:
            self.next_offset = chunk.offset + chunk.length

    def on_response(self, offset: int, ok: bool, received: int, installed: bool, now_ms: int) -> bool:
        """Digest the answer to the chunk sent at `offset`. True when the install is done."""
        if installed:
            self.done = True
            self.inflight.clear()
            return True
        current = self.inflight.pop(offset, None) is not None
        if received < 0 or received > self.size:
            if current:
                self._probe_again()  # nonsense from the follower: ask again
            return False
        if ok:
            # Progress is progress, even from an answer to a chunk sent before a rewind.
            if received > self.received:
                self.received = received
            if self.next_offset < self.received:
                self.next_offset = self.received
            for k in [k for k in self.inflight if k < self.received]:
                del self.inflight[k]  # confirmed by a later answer (answers come in order)
            if self.received == self.size and not self.inflight:
                # All there but not installed (the follower could not finish it: it said why
                # in its log). Ask again after a timeout rather than spin.
                self.retry_at = now_ms + self.cfg.chunk_timeout_ms
            return False
        if current:  # refused: not the next chunk. Continue where the follower is.
            self.inflight.clear()
            self.received = self.next_offset = received
            self.rewinds += 1
        return False

    def next_deadline(self) -> int | None:
        """When a timeout makes `next_action` act without an answer (None: nothing in flight)."""
        if self.retry_at >= 0:
            return self.retry_at
        if not self.inflight:
            return None
        return next(iter(self.inflight.values())) + self.cfg.chunk_timeout_ms
