"""Backup and restore of a group's log over the network (docs/operations.md "Backup and restore").

`backup` copies the committed log — from the lowest ledger begin of the members to the leader's
committed index when it starts, a committed prefix and so a consistent state — from any member
(FETCH, followers first) into a store directory of its own, `OUT/store`, with `OUT/backup.json`
saying what it holds. Each entry keeps its index, term, type and client-session stamp (a
restored group still recognises a client's resend); only its position is new, since the backup
has its own file layout. The backup is a store like any node's: `dledger dump`, `verify` and the
Spark file source read it.

`restore` seeds ONE node's store directory of a new group from it: the store copied and checked
(every header and CRC), and the term/vote file set to the term after the backup's last one, with
no vote. Restore
every member of the group from the same backup and start them together: they hold identical
logs, all committed, and elect a leader in the next term. (One member of a running group is not
restored: started on an empty store, it catches up from the leader by itself, docs/election.md
"Non-voting members".)

A group with a state machine rebuilds its state by replaying the log, so its backup must begin
at the first entry: once retention removed the start of the log (after snapshots), the state
lives in a snapshot, which is not served over the network, and `backup` refuses with that
reason.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from ipc.client import DLedgerClient, DLedgerError
from ipc.client import follow as follow_mod
from ipc.codes import ResponseCode as RC
from ipc.entry_codec import HEADER, iter_entries
from node.store.base import StoreConfig
from node.store.segment_store import SegmentStore
from node.store.term_vote import TermVoteFile

FORMAT = 1
INFO_FILE = "backup.json"
STORE_DIR = "store"
FETCH_BYTES = 4 << 20


class BackupError(Exception):
    """Why a backup or a restore cannot be made (one line)."""


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """What `backup.json` records."""

    format: int
    group: str
    first_index: int
    last_index: int
    last_term: int
    entries: int
    state_machine: bool
    data_file_size: int
    index_file_size: int
    created: str

    @classmethod
    def load(cls, backup_dir: Path) -> BackupInfo:
        path = backup_dir / INFO_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            info = cls(**raw)
        except FileNotFoundError:
            raise BackupError(f"{backup_dir} is not a backup: no {INFO_FILE}") from None
        except (OSError, ValueError, TypeError) as e:
            raise BackupError(f"{path} is not a backup description: {e}") from None
        if info.format != FORMAT:
            raise BackupError(f"{path}: backup format {info.format}, this version reads {FORMAT}")
        return info


def _group_has_state_machine(client: DLedgerClient) -> bool:
    """A member reports an applied index (its applier applied something): a state machine."""
    from tools.commands.group_status import GroupProbe

    peers = ";".join(f"{nid}-{h}:{p}" for nid, (h, p) in client.peers.items())
    with GroupProbe(peers, client.group, timeout=client.timeout, key_file=client.key_file) as probe:
        return any(a.meta is not None and a.meta.status is not None and a.meta.status.applied_index >= 0
                   for a in probe.round())


def backup(client: DLedgerClient, out: Path, data_file_size: int, index_file_size: int,
           progress: Callable[[int, int], None] | None = None) -> BackupInfo:
    """Copy the group's committed log into `out` (which must not exist or be empty)."""
    if out.exists() and any(out.iterdir()):
        raise BackupError(f"{out} exists and is not empty")
    md = client.metadata()
    lead = md.node(md.leader_id) if md.leader_id else None
    if lead is None or not lead.alive:
        raise BackupError("the group has no leader now: its committed index is not known")
    last = lead.committed_index
    first = md.lowest_begin()
    if last < first:
        raise BackupError("the group's log is empty: nothing to back up")
    sm = _group_has_state_machine(client)
    if sm and first > 0:
        raise BackupError(f"the group has a state machine and its log begins at {first} on every member "
                          "(retention removed the start after snapshots): its state is in a snapshot, "
                          "which is not served over the network; copy a stopped replica's store directory")
    out.mkdir(parents=True, exist_ok=True)
    store = SegmentStore(StoreConfig(store_dir=str(out / STORE_DIR), data_file_size=data_file_size,
                                     index_file_size=index_file_size))
    store.open()
    rotation = follow_mod.MemberRotation(list(client.peers), lambda: md.leader_id)
    i, term = first, -1
    try:
        while i <= last:
            msg, _node, _entries = follow_mod.fetch_raw(
                client, i, min(10_000, last - i + 1), FETCH_BYTES, 0, rotation,
                time.monotonic() + client.timeout * 4)
            blob = msg.entries
            for off, e in iter_entries(blob, verify_crc=True):
                if e.index != i or e.index > last:
                    break
                if i == first and first > 0 and store.ledger_end_index < 0:
                    # The log base: the entry before the first one is not in the group any more;
                    # the restored group never compares below it (every member restores the same).
                    store.reset_to(first - 1, e.term)
                _m, _size, _index, _term, _pos, session, seq, _crc, _n = HEADER.unpack_from(blob, off)
                store.append_leader(bytes(e.body), e.term, e.magic, session, seq)
                term = e.term
                i += 1
            if progress is not None:
                progress(i - first, last - first + 1)
        store.set_committed_index(last)
    except DLedgerError as e:
        store.close()
        shutil.rmtree(out, ignore_errors=True)
        if e.code == RC.INDEX_LESS_THAN_LOCAL_BEGIN:
            raise BackupError(f"retention removed entry {i} while it was being copied: run the backup "
                              "again") from None
        raise
    store.close()
    info = BackupInfo(FORMAT, client.group, first, last, term, last - first + 1, sm, data_file_size,
                      index_file_size, datetime.now(UTC).isoformat(timespec="seconds"))
    (out / INFO_FILE).write_text(json.dumps(asdict(info), indent=2) + "\n", encoding="utf-8")
    return info


def restore(backup_dir: Path, store_dir: Path) -> BackupInfo:
    """Seed `store_dir` (absent or empty) as one member of a new group restored from the backup."""
    info = BackupInfo.load(backup_dir)
    if store_dir.exists() and any(store_dir.iterdir()):
        raise BackupError(f"{store_dir} exists and is not empty: restore seeds a new node's store")
    src = backup_dir / STORE_DIR
    if not src.is_dir():
        raise BackupError(f"{backup_dir} has no {STORE_DIR}/ directory")
    shutil.copytree(src, store_dir, dirs_exist_ok=True)
    store = SegmentStore(StoreConfig(store_dir=str(store_dir), data_file_size=info.data_file_size,
                                     index_file_size=info.index_file_size))
    try:
        store.open()
        store.scrub()  # every header and CRC, now rather than in the node's background scrub
        got = (store.ledger_begin_index, store.ledger_end_index, store.committed_index)
        if got != (info.first_index, info.last_index, info.last_index):
            raise BackupError(f"the copied store holds begin/end/committed {got}, {INFO_FILE} says "
                              f"{info.first_index}..{info.last_index}")
    except BackupError:
        shutil.rmtree(store_dir, ignore_errors=True)
        raise
    except Exception as e:  # noqa: BLE001 - a damaged backup: one line, nothing left behind
        shutil.rmtree(store_dir, ignore_errors=True)
        raise BackupError(f"the backup's store does not check out: {e}") from None
    finally:
        store.close()
    # The new group starts one term past every entry of the backup: its leaders are never in a
    # term the old group's leaders used (an old node pointed at it by mistake sees a newer term).
    TermVoteFile(store_dir).save(info.last_term + 1, None)
    return info
