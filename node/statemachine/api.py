"""The state-machine API: what a user class implements so a DLedger group replicates it
(docs/statemachine.md "The API"; DLedger's ``StateMachine``, hashicorp/raft's ``FSM``).

The log is the replicated truth; a state machine is a deterministic function of its committed
prefix. A node's applier (a role process of its own, so a slow state machine never stalls
replication) hands the class every committed entry once, in index order, and sends each
``apply`` result back to the client that appended the entry. Snapshots let the log prefix
they cover be deleted: on start the applier restores the newest snapshot and replays only the
entries after it. That is why ``apply`` must be deterministic and ``snapshot`` must capture
exactly the state after the last applied entry: a replica that restored a snapshot and a
replica that replayed the whole log must end equal.

This module is pure and only states the contract: the applier role, snapshot files on disk
and the wire come elsewhere (the applier is not written yet). docs/statemachine.md has the
contract with an example.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

Result = bytes | None
"""What ``apply`` returns per entry: bytes for the appending client, or None (no payload)."""


@dataclass(frozen=True, slots=True)
class CommittedEntry:
    """One committed NORMAL entry. NOOP entries (written by a new leader so earlier terms'
    entries can commit) carry no user data and are never passed to a state machine.

    `body` may be a memoryview into the store's mapped file, valid only during the ``apply``
    call: copy what you keep (``bytes(body)``)."""

    index: int
    term: int
    body: bytes | memoryview


class StateMachineError(Exception):
    """A state machine broke the contract below (wrong result count or type). The applier
    stops, like for any exception raised by user code; the log is never touched."""


class StateMachine(abc.ABC):
    """Base class of every state machine.

    An abstract base class rather than a ``typing.Protocol``: the loader can then tell "not a
    state machine" from "a class that happens to have an ``apply``" with one ``issubclass``,
    and a class missing a required method fails when it is instantiated, at start, instead of
    on the first snapshot hours later.

    Construction: ``cls(options)``, one positional argument, a ``Mapping[str, str]`` of the
    class's own options (``key=value`` pairs from the command line or the config file, see
    ``loader.parse_options``; empty when none are given). Strings, because they come from a
    command line or a file: the class parses and validates them and raises (any exception) on
    a bad one; the loader turns that into a one-line error naming the class, so a node can
    refuse to start instead of failing on its first entry. Options must be the same on every replica, or at
    least must not change what ``apply`` computes.

    The applier calls the methods from one thread, never concurrently.
    """

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self.options: Mapping[str, str] = dict(options or {})

    @abc.abstractmethod
    def apply(self, entries: Sequence[CommittedEntry]) -> list[Result]:
        """Apply committed entries and return one result per entry, in the same order.

        Guarantees from the applier: entries are committed, in strictly increasing index order
        (gaps are NOOPs), and each index is applied exactly once across restarts — after a
        restart the applier restores the newest snapshot and replays only the entries after it.

        What the class must guarantee: determinism. Every replica applies the same entries, and
        their states must stay equal, so the new state and the results may depend only on the
        previous state and the entries: no clocks, randomness, environment, files, network,
        hash-randomized iteration order (``set`` of str) or floating-point reductions that
        depend on order. An input the class cannot use (a malformed body) should produce an
        error *result*, not an exception: any exception stops the applier (it is restarted like
        any role and stops again on the same entry), so it is for bugs, not for bad input.
        """

    @abc.abstractmethod
    def snapshot(self, writer: BinaryIO) -> None:
        """Write the whole state, as of the last applied entry, to `writer`.

        Called between ``apply`` calls (apply waits while it runs). Write it as a stream, not
        as one ``bytes`` of the whole state: states can be larger than memory headroom. The
        applier records the last included index and term, fsyncs and checksums the file;
        a format version and a checksum of its own still help ``restore`` reject old or damaged
        input early."""

    @abc.abstractmethod
    def restore(self, reader: BinaryIO) -> None:
        """Replace the whole state with the one `reader` holds (written by ``snapshot``).

        Called on a fresh instance at start, or on a running one when the leader installs a
        snapshot. Raise on damaged input, and leave the previous state untouched when you do
        (build the new state aside, swap it in at the end): the applier then tries an older
        snapshot."""

    def query(self, request: bytes) -> bytes:
        """Answer a read-only request from the local state (optional).

        The read path (read-index, not written yet) will call it once this replica has applied
        everything committed when the read arrived, which makes the answer linearizable. It
        must not change the state. The default serves no reads."""
        raise NotImplementedError(f"{type(self).__name__} serves no queries")

    def close(self) -> None:  # noqa: B027 - optional hook, deliberately empty
        """Release resources when the applier stops (optional)."""


def check_results(entries: Sequence[CommittedEntry], results: object) -> list[Result]:
    """The applier's check of what ``apply`` returned: a list with one ``bytes`` (or
    bytearray/memoryview, copied) or ``None`` per entry. A wrong count would send one client
    another client's answer, so it stops the applier instead."""
    if not isinstance(results, list):
        raise StateMachineError(f"apply returned {type(results).__name__}, not a list")
    if len(results) != len(entries):
        raise StateMachineError(f"apply returned {len(results)} results for {len(entries)} entries")
    out: list[Result] = []
    for i, r in enumerate(results):
        if r is None or type(r) is bytes:
            out.append(r)
        elif isinstance(r, bytes | bytearray | memoryview):
            out.append(bytes(r))
        else:
            raise StateMachineError(
                f"apply result for index {entries[i].index} is {type(r).__name__}, not bytes or None")
    return out
