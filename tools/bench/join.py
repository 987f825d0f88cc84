"""How long a new machine takes to join a group with a large log (docs/performance.md "Adding
a machine"): the figure an operator needs before replacing a dead member.

    python -m tools.bench.join --log-mib 1024 [--entry-kib 1] [--peer-push-quota 200MiB] [--json]

On a local 3-node group (plain, log only: no state machine, so the new member receives the
whole log from index 0, as a group without snapshots must send it):

The leader sends a far-behind member at most `peer_push_quota` (20 MiB/s by default, DLedger's
peerPushQuota: the others' replication keeps its bandwidth); `--peer-push-quota` changes it.

1. fills the log with `--log-mib` of `--entry-kib` entries (batches of 64, 16 in flight);
2. starts a new node with `server --join`, waits until it serves;
3. times `member add` as the CLI does it: the add (a learner) until its entry committed, then
   promotions asked every 50 ms, refused LEARNER_BEHIND until the learner holds the log, until
   one commits;
4. reports the add, the catch-up until the promotion, the whole, and the rate the learner
   received the log at.

Everything runs in a temporary directory removed at the end; every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import Future

from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC
from node.config import LOCAL_DATA_FILE_SIZE, LOCAL_INDEX_FILE_SIZE
from node.host.interpreter import child_env, module_command
from node.roles.runtime import die_with_parent
from node.wiring.ports import free_port_pairs
from tools.local_group import LocalGroup

ADD, PROMOTE = 1, 2


def _fill(c: DLedgerClient, total: int, entry: int) -> int:
    """Append `total` bytes in `entry`-byte entries; the last index."""
    body = os.urandom(entry)
    per_batch = 64
    batches = max(1, total // (entry * per_batch))
    window: list[Future] = []
    last = -1
    for _ in range(batches):
        window.append(c.append_batch_async([body] * per_batch))
        if len(window) >= 16:
            last = max(last, window.pop(0).result()[-1].index)
    for f in window:
        last = max(last, f.result()[-1].index)
    return last


def run(log_mib: int, entry_kib: int, quota: str | None = None) -> dict:
    extra = ["--peer-push-quota", quota] if quota else []
    with LocalGroup(3, extra_args=extra).start() as g:
        g.wait_leader(timeout=60)
        with DLedgerClient(g.peers, timeout=120) as c:
            t0 = time.monotonic()
            last = _fill(c, log_mib << 20, entry_kib << 10)
            fill_s = time.monotonic() - t0
            (port,) = free_port_pairs(1)
            store = g.root / "n9"
            log = open(g.root / "n9.log", "ab")  # noqa: SIM115 - handed to the child
            try:
                proc = subprocess.Popen(
                    module_command("tools.cli", "server", "--id", "n9", "--join", g.peers,
                                   "--address", f"127.0.0.1:{port}", "--store-dir", str(store),
                                   "--data-file-size", str(LOCAL_DATA_FILE_SIZE),
                                   "--index-file-size", str(LOCAL_INDEX_FILE_SIZE)),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                    env=child_env(), preexec_fn=die_with_parent)
            finally:
                log.close()
            try:
                deadline = time.monotonic() + 60
                while "serving on" not in (g.root / "n9.log").read_text(errors="replace"):
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("the new node did not start: see its log")
                    time.sleep(0.05)
                t1 = time.monotonic()
                added = c.change_membership(ADD, "n9", "127.0.0.1", port)
                t2 = time.monotonic()
                refused = 0
                while True:
                    try:
                        promoted = c.change_membership(PROMOTE, "n9")
                        break
                    except DLedgerError as e:
                        if e.code not in (RC.LEARNER_BEHIND, RC.MEMBERSHIP_CHANGE_IN_PROGRESS) \
                                or time.monotonic() - t2 > 1800:
                            raise
                        refused += 1
                        time.sleep(0.05)
                t3 = time.monotonic()
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    return {"log_mib": log_mib, "entry_kib": entry_kib, "peer_push_quota": quota or "default",
            "entries": last + 1,
            "fill_s": round(fill_s, 2), "add_s": round(t2 - t1, 3),
            "catch_up_and_promote_s": round(t3 - t2, 2), "total_s": round(t3 - t1, 2),
            "learner_mib_per_s": round(log_mib / max(t3 - t2, 1e-9), 1),
            "promotions_refused": refused, "added_at": added, "promoted_at": promoted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.join", description=__doc__.split("\n")[0])
    ap.add_argument("--log-mib", type=int, default=1024)
    ap.add_argument("--entry-kib", type=int, default=1)
    ap.add_argument("--peer-push-quota", default=None, metavar="BYTES",
                    help="the group's rate to a far-behind follower (default: the node's, 20MiB)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = run(args.log_mib, args.entry_kib, args.peer_push_quota)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"log {r['log_mib']} MiB ({r['entries']} entries of {r['entry_kib']} KiB, filled in "
              f"{r['fill_s']} s): add {r['add_s']} s, catch up + promote {r['catch_up_and_promote_s']} s "
              f"({r['learner_mib_per_s']} MiB/s), whole {r['total_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
