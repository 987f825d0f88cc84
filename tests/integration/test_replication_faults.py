"""Faults under load (docs/replication.md "Faults", docs/contracts.md C8): kills, pauses and
restarts never lose an acknowledged append, and replicas never disagree. Each test ends with every
replica's store read and compared."""

import signal
import threading
import time

from cluster import read_log, wait_for
from test_replication_processes import assert_identical_replicas

from ipc.client import DLedgerError


class Writer(threading.Thread):
    """Appends in a loop through one client; records exactly what was acknowledged."""

    def __init__(self, c, batch: int = 1) -> None:
        super().__init__(daemon=True)
        self.client = c.client(timeout=5.0)
        self.batch = batch
        self.acked: dict[int, bytes] = {}
        self.indeterminate = 0
        self.failed = 0
        self._stop_evt = threading.Event()
        self.start()

    def run(self) -> None:
        n = 0
        while not self._stop_evt.is_set():
            bodies = [b"w-%d" % (n + j) for j in range(self.batch)]
            n += self.batch
            try:
                if self.batch == 1:
                    r = self.client.append(bodies[0])
                    self.acked[r.index] = bodies[0]
                else:
                    for r, b in zip(self.client.append_batch(bodies), bodies, strict=True):
                        self.acked[r.index] = b
            except DLedgerError as e:
                if e.indeterminate:
                    self.indeterminate += 1
                else:
                    self.failed += 1

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=30)
        self.client.close()


def test_sigkill_leader_repeatedly_under_load(make_cluster):
    c = make_cluster(3)
    mon = c.start_monitor()
    c.wait_leader(timeout=15)
    # Every member holds the first NOOP before the first kill: a member that started after the
    # first election votes only once it holds what the leader had (docs/election.md
    # "Non-voting members"), and killing that leader first would leave one vote.
    c.wait_converged(timeout=15)
    w = Writer(c, batch=4)
    try:
        for _ in range(4):
            before = len(w.acked)
            wait_for(lambda before=before: len(w.acked) > before + 50, 20, "appends flowing")
            lead = c.wait_leader(timeout=15)
            c.nodes[lead].kill()
            c.wait_leader(timeout=15, among=[x for x in c.nodes if x != lead])
            c.nodes[lead].start()
        before = len(w.acked)
        wait_for(lambda: len(w.acked) > before + 50, 20, "appends flowing after the last kill")
    finally:
        w.stop()
    c.wait_converged(timeout=30)
    mon.stop()
    assert not mon.violations()
    assert len(w.acked) > 200  # appends flowed between and after the kills (checked per round)
    assert_identical_replicas(c, w.acked)


def test_sigstop_sigcont_leader_under_load(make_cluster):
    c = make_cluster(3)
    mon = c.start_monitor()
    lead = c.wait_leader(timeout=15)
    w = Writer(c)
    try:
        wait_for(lambda: len(w.acked) > 50, 20, "appends flowing")
        c.nodes[lead].signal(signal.SIGSTOP)
        c.wait_leader(timeout=15, among=[x for x in c.nodes if x != lead])
        before = len(w.acked)
        wait_for(lambda: len(w.acked) > before + 50, 20, "appends through the new leader")
        c.nodes[lead].signal(signal.SIGCONT)
        before = len(w.acked)
        wait_for(lambda: len(w.acked) > before + 50, 20, "appends after the old leader resumed")
    finally:
        w.stop()
    c.wait_converged(timeout=30)
    mon.stop()
    assert not mon.violations()
    assert_identical_replicas(c, w.acked)


def test_sigkill_all_nodes_mid_load_and_restart(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    w = Writer(c, batch=8)
    try:
        wait_for(lambda: len(w.acked) > 500, 30, "appends flowing")
        for node in c.nodes.values():
            node.signal(signal.SIGKILL)  # all at once: a power-cut of processes (not of the OS)
        for node in c.nodes.values():
            node.kill()
    finally:
        w.stop()
    acked = dict(w.acked)
    for node in c.nodes.values():
        node.start()
    c.wait_leader(timeout=20)
    with c.client() as cl:
        cl.append(b"after the restart")  # the new leader's NOOP commits everything before it
    c.wait_converged(timeout=30)
    assert_identical_replicas(c, acked)


def test_follower_down_for_50k_entries_catches_up(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    lagger = next(x for x in c.nodes if x != lead)
    c.nodes[lagger].kill()
    acked = {}
    with c.client(timeout=30) as cl:
        for k in range(500):
            bodies = [b"%05d-" % k + b"x" * 100 + b"%d" % j for j in range(100)]
            for r, b in zip(cl.append_batch(bodies), bodies, strict=True):
                acked[r.index] = b
    assert len(acked) == 50_000
    t0 = time.monotonic()
    c.nodes[lagger].start()
    c.wait_converged(timeout=90)
    caught_up_s = time.monotonic() - t0
    log = assert_identical_replicas(c, acked)
    assert len(log) >= 50_000
    assert caught_up_s < 90
    assert read_log(c.nodes[lagger].store_dir) == log


def test_flow_control_throttles_a_far_behind_follower(make_cluster):
    """docs/replication.md "Flow control": a follower more than peer_push_throttle_point entries
    behind is fed at most peer_push_quota bytes per second (sliding window), and still catches
    up."""
    from node.block.shared_state import SharedState

    quota = 1 << 20
    c = make_cluster(3, peer_push_quota=quota, peer_push_throttle_point=20, max_batch_push_size=64 << 10)
    lead = c.wait_leader(timeout=15)
    lagger = next(x for x in c.nodes if x != lead)
    c.nodes[lagger].kill()
    with c.client(timeout=30) as cl:
        for _ in range(40):
            cl.append_batch([bytes(1000)] * 100)  # ~4.2 MB the lagger will need
    block = SharedState.attach(c.nodes[lead].shm_name())
    try:
        slot = list(c.nodes).index(lagger)
        c.nodes[lagger].start()
        wait_for(lambda: block.get_peer(slot, "bytes_pushed") > 0 and block.read_peer(slot).match_index > 0,
                 20, "pushes to the returning follower")
        t0, b0 = time.monotonic(), block.get_peer(slot, "bytes_pushed")
        wait_for(lambda: time.monotonic() - t0 >= 2.0, 5, "a 2 s window")
        rate = (block.get_peer(slot, "bytes_pushed") - b0) / (time.monotonic() - t0)
        assert rate <= quota * 1.3, f"{rate:.0f} B/s pushed, quota {quota}"
        assert rate > quota * 0.3, f"{rate:.0f} B/s: throttled far below the quota"
    finally:
        block.close()
    c.wait_converged(timeout=60)
