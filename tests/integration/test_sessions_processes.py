"""Exactly-once appends through leader crashes (docs/client.md "Sessions", docs/contracts.md C19):
real processes, real SIGKILLs. A client resends every unanswered append under its session; the new
leader answers a resend of an entry it already holds with the original index. Afterwards every
replica holds each acknowledged body exactly once, at the index it was acknowledged with."""

import collections
import concurrent.futures
import threading

from cluster import read_log, wait_for

from ipc.client import DLedgerError


class SessionWriter(threading.Thread):
    """Appends unique bodies through one client, `depth` in flight (1 = one at a time)."""

    def __init__(self, c, name: str, depth: int) -> None:
        super().__init__(daemon=True)
        self.client = c.client(timeout=15.0)
        self.name, self.depth = name, depth
        self.acked: dict[bytes, int] = {}
        self.errors: list[DLedgerError] = []
        self._stop_evt = threading.Event()
        self.start()

    def run(self) -> None:
        n = 0
        inflight: collections.deque = collections.deque()
        while not self._stop_evt.is_set() or inflight:
            while not self._stop_evt.is_set() and len(inflight) < self.depth:
                body = b"%s-%06d" % (self.name.encode(), n)
                n += 1
                inflight.append((body, self.client.append_async(body)))
            body, fut = inflight.popleft()
            try:
                self.acked[body] = fut.result().index
            except DLedgerError as e:
                self.errors.append(e)
            except concurrent.futures.CancelledError:  # pragma: no cover - never cancelled
                pass

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=60)
        self.client.close()


def test_appends_survive_leader_kills_exactly_once(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    writers = [SessionWriter(c, "seq", 1), SessionWriter(c, "pipe", 32)]
    try:
        for _ in range(3):
            counts = [len(w.acked) for w in writers]
            wait_for(lambda counts=counts: all(len(w.acked) > k + 30 for w, k in zip(writers, counts, strict=True)),
                     30, "appends flowing")
            lead = c.wait_leader(timeout=15)
            c.nodes[lead].kill()
            c.wait_leader(timeout=15, among=[x for x in c.nodes if x != lead])
            c.nodes[lead].start()
        counts = [len(w.acked) for w in writers]
        wait_for(lambda: all(len(w.acked) > k + 30 for w, k in zip(writers, counts, strict=True)), 30,
                 "appends flowing after the last kill")
    finally:
        for w in writers:
            w.stop()
    c.wait_converged(timeout=30)
    for w in writers:
        assert not w.errors, f"{w.name}: {w.errors[:3]}"  # resent until acknowledged: none lost, none indeterminate
        order = [w.acked[b] for b in sorted(w.acked)]  # bodies are numbered in submission order
        assert order == sorted(order), f"{w.name}: appends acknowledged out of submission order"
    for node in c.nodes.values():
        node.stop()
    acked = {b: i for w in writers for b, i in w.acked.items()}
    for node in c.nodes.values():
        log = read_log(node.store_dir)
        bodies = collections.Counter(body for _i, _t, magic, body in log if magic == 1)
        twice = [b for b, k in bodies.items() if k > 1]
        assert not twice, f"{node.id}: written twice: {twice[:5]}"
        at = {body: index for index, _t, magic, body in log if magic == 1}
        assert all(at.get(b) == i for b, i in acked.items()), f"{node.id}: an acknowledged body moved or is missing"
