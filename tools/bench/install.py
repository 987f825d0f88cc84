"""Snapshot and install timings for a large KV state (docs/performance.md: the snapshot/install
timings for a 1 GiB state).

    python -m tools.bench.install --state-mib 1024 [--value-kib 512] [--peer-push-quota BYTES] [--json]

What it does, on a local 3-node group started with `--state-machine kv` (no automatic
snapshots, retention that deletes whatever a snapshot covers at once):

1. kills one follower (the *lagger*), then fills the state with `--state-mib` of distinct
   keys (values of `--value-kib`), 64 puts in flight;
2. `dledger snapshot` on the leader: **take** (the state machine writes its state, fsync,
   checksum, rename);
3. waits until the leader's retention deleted the log the lagger would need;
4. restarts the lagger: the leader **installs** its snapshot on it (chunks, verify, restore,
   log reset), then the lagger catches up from the log; timed from the restart until its
   ledger matches the leader's, with the install's own phases from both nodes' logs;
5. restarts the lagger once more: **restore at start** of the installed snapshot.

Everything runs in a temporary directory removed at the end; the group is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from concurrent.futures import Future

from ipc.client import DLedgerClient
from node.statemachine import kv
from tools.local_group import LocalGroup


def _wait(pred, timeout: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"tools.bench.install: timed out waiting for {what}")


def _log(g: LocalGroup, nid: str) -> str:
    return (g.root / f"{nid}.log").read_text(errors="replace")


def _ms(pattern: str, text: str) -> int | None:
    m = re.findall(pattern, text)
    return int(m[-1]) if m else None


def run(state_mib: int, value_kib: int, quota: int) -> dict:
    args = ["--state-machine", "kv", "--snapshot-threshold", str(10**12), "--max-snapshots-kept", "1",
            "--file-reserved-hours", "0", "--disk-space-ratio-to-clean", "0.0001",
            "--peer-push-quota", str(quota), "--data-file-size", str(32 << 20)]
    out: dict = {"state_mib": state_mib, "value_kib": value_kib, "peer_push_quota": quota}
    with LocalGroup(3, args) as g:
        g.start()
        lead, _term = g.wait_leader()
        lagger = next(x for x in g.ids if x != lead)
        g.kill(lagger)
        value = b"v" * (value_kib << 10)
        n = (state_mib << 20) // len(value)
        with DLedgerClient(g.peers, group=g.group, timeout=60.0, max_in_flight=64) as c:
            t0 = time.monotonic()
            futs: list[Future] = [c.append_async(kv.encode_put(b"k%08d" % i, value)) for i in range(n)]
            for f in futs:
                f.result(timeout=120)
            fill_s = time.monotonic() - t0
            out["fill"] = {"puts": n, "seconds": round(fill_s, 2), "mib_per_s": round(state_mib / fill_s, 1),
                           "group_rss_mib": round(sum(g.rss_by_process().values()) / (1 << 20))}
            t0 = time.monotonic()
            idx, term = c.take_snapshot(lead, timeout=600)
            out["take"] = {"seconds": round(time.monotonic() - t0, 2), "last_index": idx,
                           "snapshot_ms_in_applier": _ms(r"snapshot at index \d+ \(term \d+\): \d+ bytes in (\d+) ms",
                                                         _log(g, lead))}
        snap_bytes = sum(p.stat().st_size for p in (g.root / lead / "snapshots").glob("0*-*/data"))
        out["snapshot_bytes"] = snap_bytes
        _wait(lambda: (m := g.meta(lead)) and m.ledger_begin_index > 1, 120, "retention on the leader")
        end = g.meta(lead).ledger_end_index
        t0 = time.monotonic()
        g.start(lagger)
        _wait(lambda: (m := g.meta(lagger)) and m.committed_index >= end, 900, "the lagger caught up")
        out["install"] = {"seconds_to_caught_up": round(time.monotonic() - t0, 2),
                          "verify_and_restore_ms": _ms(r"installed the leader's snapshot \S+ \(\d+ bytes\) in (\d+) ms",
                                                       _log(g, lagger))}
        g.kill(lagger)
        t0 = time.monotonic()
        g.start(lagger)
        _wait(lambda: "restored the snapshot at index" in _log(g, lagger),
              600, "the restart restored the snapshot")
        out["restore_at_start_s"] = round(time.monotonic() - t0, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.install", description=__doc__.split("\n")[0])
    ap.add_argument("--state-mib", type=int, default=1024)
    ap.add_argument("--value-kib", type=int, default=512)
    ap.add_argument("--peer-push-quota", type=int, default=20 << 20,
                    help="bytes/s a far-behind peer is sent, installs included (server default 20 MiB/s)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not 1 <= a.value_kib <= 1024 or a.state_mib < 1:
        print("tools.bench.install: --value-kib must be 1..1024 and --state-mib >= 1", file=sys.stderr)
        return 2
    res = run(a.state_mib, a.value_kib, a.peer_push_quota)
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
