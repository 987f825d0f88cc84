"""The handler's end of local clients' links (`ipc.local_link`): attach, read, answer, detach.

The handler polls one doorbell for all of them (`RUN_DIR/local.bell`); a client rings it after
putting a request, and once when it creates or closes its link. On a ring the handler rescans
the link directory if it changed, then takes the requests of every attached link; the frames go
through the same `Handler.handle_frame` as the data port's, under the link's identity
(`ipc.local_link.link_ident`), and `reply` puts the answers in the link's reply ring.

A link is detached when its bell is gone from the directory (the client closed it) or its
process is dead (checked once a second: `check_alive`), and what a killed client left (its bell
and its segment) is removed then. A link whose memory does not hold a well-formed ring (a
broken or hostile client) is detached with one log line; the node carries on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ipc.doorbells import Doorbell
from ipc.local_link import (
    LINK_DIR,
    NAME_RE,
    SEGMENT_PREFIX,
    SHM_DIR,
    LocalLinkError,
    Segment,
    link_ident,
    segment_path,
)
from ipc.shm_ring import RingError

ALIVE_CHECK_MS = 1000
MAX_LINKS = 64  # links attached at once; more are left waiting (logged once per scan)
MAX_FRAMES_PER_TURN = 512  # per link and loop turn, as the data port's burst


class Attached:
    __slots__ = ("name", "pid", "segment", "bell")

    def __init__(self, name: str, pid: int, segment: Segment, bell: Doorbell) -> None:
        self.name, self.pid, self.segment, self.bell = name, pid, segment, bell


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalClients:
    def __init__(self, run_dir: str | os.PathLike[str], log: logging.Logger) -> None:
        self.dir = Path(run_dir) / LINK_DIR
        self.log = log
        self.links: dict[bytes, Attached] = {}
        self._dir_mtime = -1
        self._next_alive_ms = 0
        self.dropped_replies = 0
        try:
            self.dir.mkdir(mode=0o700, exist_ok=True)
        except OSError as e:  # the node serves on: local clients fall back to TCP
            self.disabled = True
            log.warning("local clients disabled: cannot make %s: %s", self.dir, e.strerror or e)
            return
        self.disabled = False
        self.sweep_orphans()

    # ---- attach / detach ------------------------------------------------------------------------
    def scan(self) -> None:
        """Attach every new link in the directory, detach the ones whose bell is gone. Cheap
        when nothing changed: one stat."""
        if self.disabled:
            return
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except OSError:
            return
        if mtime == self._dir_mtime:
            return
        self._dir_mtime = mtime
        present: set[str] = set()
        for entry in os.listdir(self.dir):
            name = entry[:-5] if entry.endswith(".bell") else ""
            if NAME_RE.match(name):
                present.add(name)
        for ident, link in list(self.links.items()):
            if link.name not in present:
                self._detach(ident, "closed by the client")
        for name in sorted(present):
            ident = link_ident(name)
            if ident not in self.links:
                if len(self.links) >= MAX_LINKS:
                    self.log.warning("%d local links attached: %s waits for one to close", MAX_LINKS, name)
                    break
                self._attach(name)

    def _attach(self, name: str) -> None:
        pid = int(NAME_RE.match(name).group(1))
        if not _alive(pid):
            self._remove_files(name)
            return
        try:
            fd = os.open(segment_path(name), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # being created or removed: the next scan sees it settled
        except OSError as e:
            self.log.warning("local link %s: cannot open its segment: %s", name, e)
            return
        try:
            segment = Segment(fd, create=False)
        except (LocalLinkError, RingError, ValueError, OSError) as e:
            self.log.warning("local link %s refused: %s", name, e)
            return
        finally:
            os.close(fd)
        bell = Doorbell.open(self.dir / f"{name}.bell")
        self.links[link_ident(name)] = Attached(name, pid, segment, bell)
        self.log.info("local client attached: pid %d (%s)", pid, name)

    def _detach(self, ident: bytes, why: str) -> None:
        link = self.links.pop(ident)
        link.bell.close()
        link.segment.close()
        self.log.info("local client detached: pid %d (%s): %s", link.pid, link.name, why)

    def _remove_files(self, name: str) -> None:
        for p in (self.dir / f"{name}.bell", Path(segment_path(name))):
            try:
                p.unlink()
            except OSError:
                pass

    def check_alive(self, now_ms: int) -> None:
        """Once a second: detach (and clean up after) links whose process is gone."""
        if now_ms < self._next_alive_ms:
            return
        self._next_alive_ms = now_ms + ALIVE_CHECK_MS
        for ident, link in list(self.links.items()):
            if not _alive(link.pid):
                self._detach(ident, "its process is gone")
                self._remove_files(link.name)

    def sweep_orphans(self) -> None:
        """Remove the segments of dead local clients that no handler detached (the node was
        stopped while they ran, and they were killed): /dev/shm is memory."""
        try:
            names = os.listdir(SHM_DIR)
        except OSError:
            return
        for entry in names:
            if entry.startswith(SEGMENT_PREFIX):
                m = NAME_RE.match(entry[len(SEGMENT_PREFIX):])
                if m and not _alive(int(m.group(1))):
                    try:
                        os.unlink(f"{SHM_DIR}/{entry}")
                    except OSError:
                        pass

    # ---- traffic --------------------------------------------------------------------------------
    def requests(self) -> list[tuple[bytes, bytes]]:
        """The requests waiting on every link, oldest first per link, with their identities."""
        out: list[tuple[bytes, bytes]] = []
        for ident, link in list(self.links.items()):
            try:
                frames = link.segment.requests.take(MAX_FRAMES_PER_TURN)
            except RingError as e:
                self._detach(ident, f"its request ring is broken: {e}")
                continue
            out.extend((ident, f) for f in frames)
        return out

    def pending(self) -> bool:
        """Requests left over from a turn's limit (the loop must not sleep on them)."""
        return any(not link.segment.requests.empty() for link in self.links.values())

    def reply(self, ident: bytes, frame: bytes) -> None:
        link = self.links.get(ident)
        if link is None:
            return  # the client went away: nobody to answer
        try:
            ok = link.segment.replies.put(frame)
        except ValueError:  # larger than a ring takes (a max-body-size above 8 MiB)
            self.dropped_replies += 1
            self.log.warning("local client %s: an answer of %d bytes is over the link's limit of %d; "
                             "dropped (the call times out)", link.name, len(frame),
                             link.segment.replies.max_frame)
            return
        if not ok:
            # The client stopped reading: its call times out and is retried (a stamped append
            # is answered from the session table then: never written twice).
            self.dropped_replies += 1
            return
        link.bell.ring()

    def close(self) -> None:
        """Detach everything (a handler restart re-attaches: the links stay registered)."""
        for ident in list(self.links):
            self._detach(ident, "the handler stops")
