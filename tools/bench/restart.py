"""Restart time of a follower, by log size (figures for docs/performance.md "Restart").

    python -m tools.bench.restart [--sizes 0,1,4,16] [--entry-size 1024] [--restarts 3]
                                  [--code-dir DIR] [--root DIR] [--json]

For each size (GiB of log per node) a 3-node local group is built: node n2's store is written
directly with the store's own writer (`SegmentStore.append_batch_raw`, entries of
`--entry-size` bytes, all committed, closed cleanly so its checkpoint is current: what a node
that ran and was stopped leaves), and n0/n1 get a copy of only the last two data files of it
(as if retention had deleted the rest: the same log, without 2 x 16 GB more of disk). n0 and
n1 start and elect a leader, n2 joins as a follower. Then, `--restarts` times: SIGTERM n2's
supervisor, wait for it to exit, start it again and poll its METADATA every 10 ms; the time
from the start to the first answer is one sample ("to METADATA"), and to its METADATA naming
a leader as a FOLLOWER -- or saying it leads: it may win the next term -- a second one
("rejoined").

Each restart is broken down from n2's log (JSON lines): launch -> the supervisor's "node
starting" (interpreter, imports of the CLI and the supervisor, store lock, shared block), ->
"started handler" (the role processes spawned), -> the store's "recovered" line (the handler's
interpreter and imports, the block attached, the store opened; the line says how long the
open took, when the code logs it), -> "serving on" (sockets bound), -> the first METADATA
answer (as seen by this tool).

`--code-dir DIR` (repeatable; `.` is this checkout): run the servers from another checkout
(e.g. `git archive` of an older commit unpacked in DIR); each is measured in turn on the same
stores (a fresh group per version), for before/after figures in one sitting. Every server is
stopped and the stores removed at the end, also on errors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from ipc.codes import Role
from node.config import LOCAL_DATA_FILE_SIZE, LOCAL_INDEX_FILE_SIZE
from node.store.base import StoreConfig
from node.store.codec import HEADER_SIZE
from node.store.layout import CHECKPOINT_FILE, DATA_DIR, INDEX_DIR, list_segments
from node.store.segment_store import SegmentStore
from node.store.term_vote import TermVoteFile
from tools.local_group import LocalGroup

GIB = 1 << 30
BATCH = 4096


def write_store(store_dir: Path, size_bytes: int, entry_size: int) -> int:
    """A log of about `size_bytes` of `entry_size`-byte entries in term 1, all committed, written
    with the store's writer and closed (checkpoint current). Returns the entry count."""
    cfg = StoreConfig(str(store_dir), data_file_size=LOCAL_DATA_FILE_SIZE,
                      index_file_size=LOCAL_INDEX_FILE_SIZE)
    n = size_bytes // entry_size
    body = os.urandom(max(1, entry_size - HEADER_SIZE))
    with SegmentStore(cfg) as s:
        while s.ledger_end_index + 1 < n:
            s.append_batch_raw([body] * min(BATCH, n - s.ledger_end_index - 1), 1)
        s.set_committed_index(s.ledger_end_index)
    return n


def copy_tail(src: Path, dst: Path, data_files: int = 2) -> None:
    """`dst` gets the last `data_files` data files of `src`, the index files their entries'
    records are in, and the checkpoint: the same log as `src` with its front deleted (what
    retention leaves), which every version opens."""
    segs = list_segments(src / DATA_DIR)
    (dst / DATA_DIR).mkdir(parents=True)
    (dst / INDEX_DIR).mkdir(parents=True)
    if not segs:
        return
    keep = segs[-data_files:]
    for s in keep:
        shutil.copyfile(s.path, dst / DATA_DIR / s.path.name)
    # The first kept entry's record: the header at the start of the first kept file.
    with open(keep[0].path, "rb") as fh:
        first_index = int.from_bytes(fh.read(16)[8:16], "big")
    for s in list_segments(src / INDEX_DIR):
        if s.end > first_index * 32:
            shutil.copyfile(s.path, dst / INDEX_DIR / s.path.name)
    shutil.copyfile(src / CHECKPOINT_FILE, dst / CHECKPOINT_FILE)


def _events(log: Path, since: float) -> dict[str, float]:
    """Wall-clock times of the start-up lines of one node's log written after `since`."""
    out: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        ts = datetime.fromisoformat(rec["ts"]).timestamp()
        if ts < since - 0.002:
            continue
        msg = rec.get("msg", "")
        for key, marker in (("supervisor", "node starting"), ("spawned", "started handler"),
                            ("recovered", ": recovered "), ("serving", "serving on")):
            if marker in msg and key not in out:
                out[key] = ts
                if key == "recovered" and " opened in " in msg:
                    out["open_ms"] = float(msg.rsplit(" opened in ", 1)[1].split(" ms")[0])
    return out


def _wait(cond, timeout: float, what: str) -> float:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        time.sleep(0.01)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def _rejoined(g: LocalGroup, nid: str) -> bool:
    """`nid` is in the group again: following a leader (any: on a busy machine leadership may
    move meanwhile), or leading. A node restarted after it had voted for itself campaigns in a
    new term at once (it may not in its old one: docs/election.md), and with a log as long as
    anyone's it can win it: waiting for it to follow timed out then (about 1 run in 8)."""
    m = g.meta(nid, 50)
    return m is not None and (m.role == Role.LEADER or (m.role == Role.FOLLOWER and bool(m.leader_id)))


def restart_once(g: LocalGroup, nid: str, timeout: float) -> dict[str, float]:
    """SIGTERM `nid`'s supervisor, start it again; seconds to each phase (see module doc)."""
    was = g.meta(nid, 200)
    p = g.procs[nid]
    os.kill(p.pid, signal.SIGTERM)
    p.wait(timeout=60)
    t0_wall, t0 = time.time(), time.monotonic()
    g.start(nid)
    t_meta = _wait(lambda: g.meta(nid, 50) is not None, timeout, f"{nid} to answer METADATA")
    t_meta_wall = t0_wall + (t_meta - t0)

    t_join = _wait(lambda: _rejoined(g, nid), timeout, f"{nid} to follow a leader or lead")
    ev = _events(g.root / f"{nid}.log", t0_wall)
    out = {"to_metadata": t_meta - t0, "rejoined": t_join - t0,
           "was_leader": float(was is not None and was.role == Role.LEADER)}
    marks = [("supervisor", "launch_to_supervisor"), ("spawned", "supervisor_to_spawn"),
             ("recovered", "spawn_to_recovered"), ("serving", "recovered_to_serving")]
    prev = t0_wall
    for key, name in marks:
        if key in ev:
            out[name] = ev[key] - prev
            prev = ev[key]
    out["serving_to_metadata"] = t_meta_wall - prev
    if "open_ms" in ev:
        out["store_open"] = ev["open_ms"] / 1000
    return out


def bench_size(gib: float, args: argparse.Namespace) -> list[dict]:
    """Write the stores for one size once, then measure each code version on them in turn (a
    fresh group per version, same files: A/B in one sitting)."""
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="dledger-restart-"))
    base = root / f"g{gib:g}"
    out = []
    try:
        t = time.monotonic()
        n = write_store(base / "n2", int(gib * GIB), args.entry_size)
        for x in ("n0", "n1"):
            copy_tail(base / "n2", base / x)
        for x in ("n0", "n1", "n2"):
            # Each ran in term 1 and was stopped: its term/vote file says so. Without one a
            # node with a log counts as having lost its term state and waits for the others'
            # terms before it votes (docs/election.md), and n0 and n1 never elect before n2.
            TermVoteFile(base / x).save(1, None)
        gen_s = time.monotonic() - t
        for code in args.code_dir or [None]:
            g = LocalGroup(3, extra_args=["--log-format", "json"], root=str(base))
            g.cwd = None if code in (None, ".") else code
            try:
                g.start("n0")
                g.start("n1")
                g.wait_leader(["n0", "n1"], timeout=args.timeout)
                g.start("n2")
                _wait(lambda g=g: _rejoined(g, "n2"), args.timeout, "n2 to follow or lead")
                samples = [restart_once(g, "n2", args.timeout) for _ in range(args.restarts)]
            finally:
                g.close()
            keys = list(dict.fromkeys(k for s in samples for k in s))
            out.append({"gib": gib, "code": code or ".", "entries": n, "entry_size": args.entry_size,
                        "generate_s": round(gen_s, 1), "loadavg": round(os.getloadavg()[0], 1),
                        "median": {k: round(statistics.median([s[k] for s in samples if k in s]), 3)
                                   for k in keys},
                        "samples": samples})
    finally:
        if not args.keep:
            shutil.rmtree(base if args.root else root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.restart", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,1", help="GiB of log per node, comma-separated (default 0,1)")
    ap.add_argument("--entry-size", type=int, default=1024, help="bytes per entry, header included")
    ap.add_argument("--restarts", type=int, default=3, help="restarts measured per size")
    ap.add_argument("--code-dir", action="append", default=None,
                    help="run the servers from this checkout (repeat: each is measured on the same "
                         "stores, in turn; '.' is this one)")
    ap.add_argument("--root", default=None, help="where the stores go (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds any one wait may take")
    ap.add_argument("--keep", action="store_true", help="keep the stores and logs (debugging)")
    ap.add_argument("--json", action="store_true", help="one JSON object per size")
    args = ap.parse_args(argv)
    for gib in (float(x) for x in args.sizes.split(",")):
        for r in bench_size(gib, args):
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"{gib:g} GiB ({r['entries']} entries of {args.entry_size} B), code {r['code']}, "
                      f"load {r['loadavg']}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["median"].items()),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
