"""`make run`: the main job, end to end, printed as it happens.

Starts a local 3-node group (three `dledger server` processes on free loopback ports, stores
in a temporary directory with 64 MiB data / 8 MiB index files: tools/local_group.py), appends
entries through the client library and reads them back.
Then a failover, measured rather than estimated:

* a sequential writer (its own client, sessions on) appends small bodies one at a time from
  before the kill until the new leader has acknowledged some;
* the leader is SIGKILLed (its whole process group) and the survivors are asked directly
  every 10 ms until they agree on a leader in a higher term: the **election time**;
* the **write outage** is kill -> the writer's first acknowledged append in a higher term.

It also shows what a client session does with a lost reply, with the wire messages in plain
sight: before the kill an APPEND stamped (session, seq 1) goes to the old leader; after the
failover the very same stamped APPEND is resent to the new leader, which answers with the
original index and writes nothing. Finally the killed node rejoins, and the committed log is
checked: every acknowledged body exactly once, at its acknowledged index (exit 1 otherwise).
Everything is stopped by PID and the stores removed, even on Ctrl-C, SIGTERM or an error (a
run that was SIGKILLed leaves them for the next local group to reclaim).
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from pathlib import Path

from ipc import protocol as P
from ipc.client import DLedgerClient, DLedgerError
from ipc.codes import ResponseCode as RC
from node.block.shared_state import segment_name
from tools.bench.failover import Writer
from tools.local_group import LocalGroup


class _Writer(Writer):
    """tools/bench/failover.py's writer with a distinct body per append, so the log can be checked:
    keeps (ack monotonic time, term) in `acks` as its base does, and (index, body) in `entries`."""

    def __init__(self, peers: str, group: str, key_file: str | os.PathLike[str] | None = None) -> None:
        super().__init__(peers, group, key_file)
        self.entries: list[tuple[int, bytes]] = []

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            body = b"writer-%06d" % n
            n += 1
            try:
                r = self.client.append(body)
            except DLedgerError:
                self.errors += 1
                continue
            with self.lock:
                self.acks.append((time.monotonic(), r.term))
                self.entries.append((r.index, body))


def _wait(cond, timeout: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except DLedgerError:  # nodes may still be starting
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def _ask(g: LocalGroup, nid: str, msg: object, timeout_ms: int = 2000) -> object | None:
    """One request to one node over a fresh DEALER, as LocalGroup.meta does; None if silent."""
    s = g.dealer(nid)  # a CURVE client with the group's admin key
    try:
        s.send(P.encode(msg))
        return P.decode(s.recv()) if s.poll(timeout_ms) else None
    finally:
        s.close()


def _stamped_append(g: LocalGroup, among: list[str], session: int, body: bytes,
                    rid: int) -> tuple[str, P.AppendResponse]:
    """APPEND `body` stamped (session, seq 1) to the agreed leader of `among` until it answers
    SUCCESS; a refusal such as NOT_LEADER or TERM_NOT_READY means "not stored", so sending the
    same stamp again is safe (that is the point of the stamp)."""
    deadline = time.monotonic() + 15
    last: object = None
    while time.monotonic() < deadline:
        lead = g.leader(among)
        if lead:
            last = _ask(g, lead[0], P.AppendRequest(g.group, lead[0], body, rid, session, 1))
            if isinstance(last, P.AppendResponse) and last.code == RC.SUCCESS:
                return lead[0], last
        time.sleep(0.05)
    raise RuntimeError(f"the stamped append got no SUCCESS within 15 s (last answer {last!r})")


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_signal)  # SIGTERM runs the finally below, too
    g = LocalGroup(3, secure=True)  # the secure path, as `dledger cluster` runs it
    w: _Writer | None = None
    print(f"DLedger for Python — a 3-node group on 127.0.0.1\n  peers: {g.peers}\n  stores: {g.root}"
          f"\n  key-file: {g.key_file} (CurveZMQ: clients without a key the group knows are refused)")
    try:
        g.start()
        with DLedgerClient(g.peers, g.group, timeout=10.0, key_file=g.key_file) as c:
            lead, term = g.wait_leader(timeout=30)
            m = _wait(lambda: (x := c.metadata(timeout=1.0)).leader_id == lead and all(
                n.alive and n.ledger_end_index >= 0 for n in x.nodes) and x, 10, "every node to follow")
            print(f"\nleader elected: {lead} (term {term})")
            for n in m.nodes:
                print(f"  {n.id}: {n.role:<9} term={n.term} end={n.ledger_end_index}")

            print("\nappending 3 entries one by one, and a batch of 5:")
            written: dict[int, bytes] = {}
            for body in (b"hello", b"replicated", b"world"):
                r = c.append(body)
                written[r.index] = body
                print(f"  append {body!r:<14} -> index={r.index} term={r.term}")
            batch = [b"batch-%d" % i for i in range(5)]
            for r, body in zip(c.append_batch(batch), batch, strict=True):
                written[r.index] = body
            print(f"  batch of 5      -> indexes {min(written) + 3}..{max(written)}")

            print("\nreading them back (committed entries only):")
            for e in c.get_range(0, max(written) + 1):
                print(f"  {e.index:>3} term={e.term} {e.type:<6} {e.body!r}")

            # A session's append, by hand: the wire messages the client library sends.
            lead, term = g.wait_leader()
            opened = _ask(g, lead, P.OpenSessionRequest(g.group, lead, request_id=1))
            if not (isinstance(opened, P.OpenSessionResponse) and opened.code == RC.SUCCESS):
                raise RuntimeError(f"OPEN_SESSION on {lead} answered {opened!r}")
            sid, once = opened.session, b"once-" + os.urandom(4).hex().encode()
            _, first = _stamped_append(g, g.ids, sid, once, rid=2)
            print(f"\nclient sessions: {lead} opened session {sid:#x}; APPEND {once!r} stamped "
                  f"(session {sid:#x}, seq 1)\n  -> index {first.index}; suppose that reply was lost: "
                  "it is resent after the failover below")

            w = _Writer(g.peers, g.group, g.key_file)
            w.start()
            if w.first_ack_after(time.monotonic(), term - 1, time.monotonic() + 10) is None:
                raise RuntimeError("the writer got no append acknowledged within 10 s")
            time.sleep(0.5)

            survivors = [x for x in g.ids if x != lead]
            print(f"\na writer appends small entries one at a time; SIGKILL the leader {lead} "
                  f"(term {term}, all its processes) ...")
            t_kill = time.monotonic()
            g.kill(lead)
            while not ((got := g.leader(survivors)) and got[1] > term):
                if time.monotonic() - t_kill > 30:
                    raise RuntimeError(f"no new leader among {survivors} within 30 s")
                time.sleep(0.01)
            elected = time.monotonic() - t_kill
            ack = w.first_ack_after(t_kill, term, t_kill + 30)
            if ack is None:
                raise RuntimeError("the writer got nothing acknowledged by the new leader within 30 s")
            time.sleep(0.5)  # the writer goes on a little under the new leader
            w.stop.set()
            w.join(timeout=30)
            before = sum(1 for at, _ in w.acks if at < t_kill)
            print(f"new leader {got[0]} (term {got[1]}) elected {elected:.2f} s after the kill; the "
                  f"writer's next acknowledged append came {ack - t_kill:.2f} s after it\n"
                  f"  ({before} appends before the kill, {len(w.acks) - before} after, {w.errors} errors)")

            resent_to, again = _stamped_append(g, survivors, sid, once, rid=3)
            same = again.index == first.index
            print(f"\nresending the same stamped APPEND (session {sid:#x}, seq 1) to the new leader "
                  f"{resent_to} -> index {again.index}" + (" (the same index)" if same else
                                                          f" (NOT the original {first.index})"))
            print("  the client resends an unanswered append under its session; the leader recognises it\n"
                  "  and answers with the original index instead of writing it again (a new leader\n"
                  "  rebuilds its session table from its own log, so this holds across a failover)")

            print(f"\nrestarting {lead}; it rejoins as a follower and catches up")
            g.start(lead)
            last = max([first.index, again.index, *(i for i, _ in w.entries)])
            m = _wait(lambda: (x := c.metadata(timeout=1.0)) and all(
                n.alive and n.committed_index >= last for n in x.nodes) and x, 30,
                "every replica to commit the last entry")
            for n in m.nodes:
                print(f"  {n.id}: {n.role:<9} term={n.term} end={n.ledger_end_index} "
                      f"committed={n.committed_index}")

            end = min(n.committed_index for n in m.nodes)  # the whole committed log
            where: defaultdict[bytes, list[int]] = defaultdict(list)
            for e in c.get_range(0, end + 1):
                if e.type == "NORMAL":
                    where[e.body].append(e.index)
            acked = [*written.items(), *w.entries]
            bad = [(i, b) for i, b in acked if where[b] != [i]]
            once_ok = same and where[once] == [first.index]
            print(f"\nin the committed log (indexes 0..{end}): {once!r} "
                  + (f"once, at index {first.index}" if once_ok else f"at indexes {where[once]}"))
            print(f"every acknowledged append ({len(acked)}: 8 above, {len(w.entries)} by the writer) "
                  "exactly once at its acknowledged index: "
                  + ("yes" if not bad else f"NO, {len(bad)} wrong, e.g. {bad[:3]}"))
            return 0 if once_ok and not bad else 1
    except KeyboardInterrupt:
        print("\ninterrupted")
        return 130
    finally:
        if w is not None:
            w.close()
        g.close()
        # A node killed and not restarted yet (an interrupted run) leaves its shared block.
        for x in g.ids:
            Path("/dev/shm", segment_name(g.group, x, g.root / x)).unlink(missing_ok=True)
        print("\nstopped every node; removed", g.root)


if __name__ == "__main__":
    raise SystemExit(main())
