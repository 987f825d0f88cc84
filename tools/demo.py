"""`make run`: the main job, end to end, printed as it happens.

Starts a local 3-node group (three `dledger server` processes on free loopback ports, stores
in a temporary directory), appends entries through the client library, reads them back,
SIGKILLs the leader, appends again through the newly elected leader, shows that every replica
holds the same committed log, and stops everything (by PID, even on Ctrl-C or an error).
"""

from __future__ import annotations

import time

from ipc.client import DLedgerClient
from tools.local_group import LocalGroup


def _wait(cond, timeout: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception:  # noqa: BLE001 - nodes may still be starting
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def main() -> int:
    g = LocalGroup(3)
    peers = g.peers
    print(f"DLedger for Python — a 3-node group on 127.0.0.1\n  peers: {peers}\n  stores: {g.root}")
    try:
        g.start()
        with DLedgerClient(peers, timeout=10.0) as c:
            def leader() -> str | None:
                m = c.metadata(timeout=1.0)
                return m.leader_id if m.leader_id and sum(n.alive for n in m.nodes) >= 2 else None

            lead = _wait(leader, 20, "a leader")
            m = c.metadata()
            print(f"\nleader elected: {lead} (term {m.term})")
            for n in m.nodes:
                print(f"  {n.id}: {n.role:<9} term={n.term} end={n.ledger_end_index}")

            print("\nappending 3 entries one by one, and a batch of 5:")
            written = {}
            for body in (b"hello", b"replicated", b"world"):
                r = c.append(body)
                written[r.index] = body
                print(f"  append {body!r:<14} -> index={r.index} term={r.term}")
            for r, body in zip(c.append_batch([b"batch-%d" % i for i in range(5)]),
                               [b"batch-%d" % i for i in range(5)], strict=True):
                written[r.index] = body
            print(f"  batch of 5      -> indexes {min(written) + 3}..{max(written)}")

            print("\nreading them back (committed entries only):")
            for e in c.get_range(0, max(written) + 1):
                print(f"  {e.index:>3} term={e.term} {e.type:<6} {e.body!r}")

            print(f"\nSIGKILL the leader {lead} (all its processes) ...")
            t0 = time.monotonic()
            g.kill(lead)
            new = _wait(lambda: (x := leader()) and x != lead and x, 20, "a new leader")
            print(f"new leader: {new} after {time.monotonic() - t0:.2f} s")
            r = c.append(b"after failover")
            written[r.index] = b"after failover"
            print(f"  append b'after failover' -> index={r.index} term={r.term}")

            print(f"\nrestarting {lead}; it rejoins as a follower and catches up")
            g.start(lead)
            _wait(lambda: all(n.alive and n.committed_index >= r.index for n in c.metadata().nodes),
                  20, "every replica to commit the last entry")
            m = c.metadata()
            for n in m.nodes:
                print(f"  {n.id}: {n.role:<9} term={n.term} end={n.ledger_end_index} "
                      f"committed={n.committed_index}")
            lost = [i for i, b in written.items() if c.get(i).body != b]
            print("\nall acknowledged entries present:", "yes" if not lost else f"NO, lost {lost}")
            return 0 if not lost else 1
    finally:
        g.close()
        print("\nstopped every node; removed", g.root)


if __name__ == "__main__":
    raise SystemExit(main())
