"""One cross-process wake-up, measured alone: today's ZeroMQ hint against doorbells.

Why: a commit crosses seven in-node wake-ups, and docs/performance.md's trace shows each costing
100-190 µs on two busy cores where the work they carry is a few µs. A wake-up channel carries
hints only (docs/design.md): what it costs is the wake-up itself. This ping-pongs a one-byte hint
between two processes, N round trips, each side waiting as a role waits (in a `zmq.Poller`, with
a timeout) and draining what arrived as a role drains, and reports one round trip (two
wake-ups) as p50/p99/mean µs, for:

- ``zmq``: a PUSH/PULL pair over ipc:// built by `ipc.sockets.push`/`pull` (the roles' options),
  the receiver drained with `ipc.sockets.drain`: exactly the ACK/COMMIT/APPLY hint channels;
- ``eventfd``: `os.eventfd` (non-blocking), polled as a raw fd in the same `zmq.Poller`;
- ``pipe``: a non-blocking pipe (what a named FIFO in the run directory is), same poller;
- ``futex``: FUTEX_WAIT/FUTEX_WAKE via ctypes on a word in a `multiprocessing.shared_memory`
  block. It cannot be polled together with sockets: a role would need a second thread (or a
  busy poll) to wait on it beside its ZeroMQ sockets, so it is here as the floor only.

``--fanout N`` measures one ringer waking N waiters and waiting for all their answers (the
handler waking its dispatchers): ZeroMQ as the old "appended" hint (one PUB send, N conflated
SUBs), doorbells as now (one per waiter, rung in turn).

``--busy N`` starts N processes spinning beside the two (a busy machine: the wake-up then also
waits for a core). The spinners are stopped by PID when the run ends.

  .venv/bin/python -m tools.bench.wakeup --count 5000
  .venv/bin/python -m tools.bench.wakeup --count 5000 --busy 2
  .venv/bin/python -m tools.bench.wakeup --count 5000 --fanout 2
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing import shared_memory

import zmq

from ipc import sockets

KINDS = ("zmq", "eventfd", "pipe", "futex")
POLL_MS = 1000  # every wait has a timeout, as in the roles
_SYS_FUTEX = 202  # x86_64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


# ---- one side's "ring" and "wait" for each kind ---------------------------------------------
class _Zmq:
    """The roles' hint channel: PUSH (connect) -> PULL (bind), drained on wake-up."""

    def __init__(self, run_dir: str, tx: str, rx: str) -> None:
        self.ctx = sockets.make_context()
        # Endpoints of this benchmark's own (not a node's declared channels: tests/unit/test_channels.py).
        rx_addr, tx_addr = sockets.ipc_path(run_dir, rx), sockets.ipc_path(run_dir, tx)
        self.rx = sockets.pull(self.ctx, rx_addr)
        self.tx = sockets.push(self.ctx, tx_addr)
        self.poller = zmq.Poller()
        self.poller.register(self.rx, zmq.POLLIN)

    def ring(self) -> None:
        try:
            self.tx.send(b"a", zmq.NOBLOCK)
        except zmq.Again:
            pass

    def wait(self) -> bool:
        if not self.poller.poll(POLL_MS):
            return False
        sockets.drain(self.rx)
        return True

    def close(self) -> None:
        self.ctx.destroy(linger=0)


class _Fd:
    """An eventfd or a pipe: written to ring, polled as a raw fd in a zmq.Poller, read to drain."""

    def __init__(self, tx_fd: int, rx_fd: int, eventfd: bool) -> None:
        self.tx_fd, self.rx_fd, self.eventfd = tx_fd, rx_fd, eventfd
        self.poller = zmq.Poller()
        self.poller.register(rx_fd, zmq.POLLIN)

    def ring(self) -> None:
        try:
            if self.eventfd:
                os.eventfd_write(self.tx_fd, 1)
            else:
                os.write(self.tx_fd, b"\0")
        except BlockingIOError:
            pass  # already rung and not yet drained: nothing is lost

    def wait(self) -> bool:
        if not self.poller.poll(POLL_MS):
            return False
        try:
            if self.eventfd:
                os.eventfd_read(self.rx_fd)
            else:
                os.read(self.rx_fd, 4096)
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        pass


class _Futex:
    """A sequence word per direction in shared memory: ring = bump it and FUTEX_WAKE; wait =
    FUTEX_WAIT while it still holds the value last seen (a ring in between makes WAIT return
    at once, EAGAIN: no lost wake-up)."""

    def __init__(self, shm: shared_memory.SharedMemory, tx_word: int, rx_word: int) -> None:
        self.shm = shm  # created before the fork: both sides map the same pages
        self.words = (ctypes.c_int32 * 2).from_buffer(self.shm.buf)
        self.tx, self.rx = tx_word, rx_word
        self.seen = self.words[rx_word]
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long
        self.addr_tx = ctypes.addressof(self.words) + 4 * tx_word
        self.addr_rx = ctypes.addressof(self.words) + 4 * rx_word
        self.timeout = _Timespec(POLL_MS // 1000, (POLL_MS % 1000) * 1_000_000)

    def ring(self) -> None:
        self.words[self.tx] = (self.words[self.tx] + 1) & 0x7FFFFFFF  # one writer per word
        self.libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self.addr_tx), _FUTEX_WAKE, 1, None, None, 0)

    def wait(self) -> bool:
        while self.words[self.rx] == self.seen:
            r = self.libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self.addr_rx), _FUTEX_WAIT,
                                  ctypes.c_int32(self.seen), ctypes.byref(self.timeout), None, 0)
            if r != 0 and ctypes.get_errno() == 110:  # ETIMEDOUT
                return False
        self.seen = self.words[self.rx]
        return True

    def close(self) -> None:
        del self.words  # the creator closes and unlinks the block


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


# ---- the ping-pong --------------------------------------------------------------------------
def _make_side(kind: str, setup: dict, side: int) -> _Zmq | _Fd | _Futex:
    """Side 0 rings channel a and waits on b; side 1 the other way round."""
    if kind == "zmq":
        names = ("a.pull", "b.pull")
        return _Zmq(setup["dir"], names[side], names[1 - side])
    if kind in ("eventfd", "pipe"):
        a, b = setup["fds"]  # each: (read end, write end)
        tx, rx = (a, b) if side == 0 else (b, a)
        return _Fd(tx[1], rx[0], kind == "eventfd")
    return _Futex(setup["shm"], side, 1 - side)


def _echo(kind: str, setup: dict, count: int, ready: mp.Event) -> None:
    """Side 1: answer each wake-up with one."""
    s = _make_side(kind, setup, 1)
    ready.set()
    try:
        answered = 0
        while answered < count + 1:  # +1: the warm-up ring
            if s.wait():
                s.ring()
                answered += 1
            elif os.getppid() == 1:
                return
    finally:
        s.close()


def _fds(kind: str) -> tuple[tuple[int, int], tuple[int, int]]:
    out = []
    for _ in range(2):
        if kind == "eventfd":
            fd = os.eventfd(0, os.EFD_NONBLOCK)
            out.append((fd, fd))
        else:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            out.append((r, w))
    return out[0], out[1]


def run_kind(kind: str, count: int) -> list[float]:
    """`count` round trips of `kind`; each round trip's µs."""
    mpc = mp.get_context("fork")
    setup: dict = {}
    cleanup: list[Callable[[], None]] = []
    tmp = tempfile.TemporaryDirectory(prefix="dl-wakeup-")
    cleanup.append(tmp.cleanup)
    setup["dir"] = tmp.name
    if kind in ("eventfd", "pipe"):
        setup["fds"] = _fds(kind)
        fds = {fd for pair in setup["fds"] for fd in pair}
        cleanup.append(lambda: [os.close(fd) for fd in fds])
    if kind == "futex":
        shm = shared_memory.SharedMemory(create=True, size=8)
        shm.buf[:8] = bytes(8)
        setup["shm"] = shm
        cleanup.append(lambda: (shm.close(), shm.unlink()))
    ready = mpc.Event()
    child = mpc.Process(target=_echo, args=(kind, setup, count, ready), daemon=True)
    child.start()
    s = None
    try:
        if not ready.wait(30):
            raise RuntimeError(f"{kind}: the echo process did not start")
        s = _make_side(kind, setup, 0)
        for _ in range(100):  # PUSH connects lazily: ring until the first answer comes
            s.ring()
            if s.wait():
                break
        else:
            raise RuntimeError(f"{kind}: no answer")
        times = []
        clock = time.perf_counter_ns
        for _ in range(count):
            t0 = clock()
            s.ring()
            while not s.wait():
                pass
            times.append((clock() - t0) / 1000)
        return times
    finally:
        if s is not None:
            s.close()
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
        for c in reversed(cleanup):
            c()


# ---- fan-out: one ringer, N waiters (the handler waking its dispatchers) -----------------------
FANOUT_KINDS = ("zmq", "eventfd", "pipe")


def _fanout_echo(kind: str, setup: dict, i: int, stop: mp.Event, ready: mp.Event) -> None:
    """Waiter i: answer every wake-up on its own way back until told to stop."""
    if kind == "zmq":
        ctx = sockets.make_context()
        down = sockets.sub(ctx, setup["down"], conflate=True)  # as the old "appended" SUB
        up = sockets.push(ctx, setup["up"])
        poller = zmq.Poller()
        poller.register(down, zmq.POLLIN)
    else:
        (rd, _), (_, wr) = setup["fds"][i]
        poller = zmq.Poller()
        poller.register(rd, zmq.POLLIN)
    ready.set()
    try:
        while not stop.is_set() and os.getppid() != 1:
            if not poller.poll(100):
                continue
            if kind == "zmq":
                sockets.drain(down)
                up.send(b"a")
            elif kind == "eventfd":
                os.eventfd_read(rd)
                os.eventfd_write(wr, 1)
            else:
                os.read(rd, 4096)
                os.write(wr, b"\0")
    finally:
        if kind == "zmq":
            ctx.destroy(linger=0)


def run_fanout(kind: str, count: int, n: int) -> list[float]:
    """`count` rounds of: ring `n` waiters (one ZeroMQ PUB send, or one doorbell each, rung in
    turn as the handler rings its dispatchers), wait until every one answered; each round's µs."""
    mpc = mp.get_context("fork")
    tmp = tempfile.TemporaryDirectory(prefix="dl-wakeup-")
    setup: dict = {"down": "ipc://" + os.path.join(tmp.name, "down.pub"),
                   "up": "ipc://" + os.path.join(tmp.name, "up.pull")}
    fds: list[int] = []
    ctx = None
    if kind == "zmq":
        ctx = sockets.make_context()
        pub = sockets.pub(ctx, setup["down"])
        pull = sockets.pull(ctx, setup["up"])
    else:
        setup["fds"] = [_fds(kind) for _ in range(n)]
        fds = sorted({fd for pairs in setup["fds"] for pair in pairs for fd in pair})
    stop = mpc.Event()
    readies = [mpc.Event() for _ in range(n)]
    kids = [mpc.Process(target=_fanout_echo, args=(kind, setup, i, stop, readies[i]), daemon=True)
            for i in range(n)]
    for k in kids:
        k.start()
    poller = zmq.Poller()
    if kind == "zmq":
        poller.register(pull, zmq.POLLIN)
    else:
        for (_, (rd, _)) in setup["fds"]:
            poller.register(rd, zmq.POLLIN)

    def ring() -> None:
        if kind == "zmq":
            pub.send(b"1")
        else:
            for ((_, wr), _) in setup["fds"]:
                if kind == "eventfd":
                    os.eventfd_write(wr, 1)
                else:
                    os.write(wr, b"\0")

    def answers(timeout_ms: int) -> int:
        got = 0
        for sock_or_fd, _ in poller.poll(timeout_ms):
            if kind == "zmq":
                while True:
                    try:
                        pull.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    got += 1
            elif kind == "eventfd":
                got += os.eventfd_read(sock_or_fd)
            else:
                got += len(os.read(sock_or_fd, 4096))
        return got

    try:
        for r in readies:
            if not r.wait(30):
                raise RuntimeError(f"{kind}: a waiter did not start")
        for _ in range(200):  # SUBs join late: ring until every waiter answers one round
            ring()
            got, deadline = 0, time.monotonic() + 0.05
            while got < n and time.monotonic() < deadline:
                got += answers(10)
            if got >= n:
                break
        else:
            raise RuntimeError(f"{kind}: the waiters did not all answer")
        while answers(50):  # late answers to the warm-up rings
            pass
        times = []
        clock = time.perf_counter_ns
        for _ in range(count):
            t0 = clock()
            ring()
            got = 0
            while got < n:
                got += answers(POLL_MS)
            times.append((clock() - t0) / 1000)
        return times
    finally:
        stop.set()
        for k in kids:
            k.join(10)
            if k.is_alive():
                k.kill()
                k.join()
        if ctx is not None:
            ctx.destroy(linger=0)
        for fd in fds:
            os.close(fd)
        tmp.cleanup()


def _spin() -> None:
    while True:
        pass


def summary(times: list[float]) -> dict[str, float]:
    q = statistics.quantiles(times, n=100)
    return {"p50_us": round(q[49], 1), "p99_us": round(q[98], 1), "mean_us": round(statistics.fmean(times), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.wakeup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=5000, help="round trips per kind")
    ap.add_argument("--busy", type=int, default=0, help="processes spinning beside the two")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: " + ", ".join(KINDS))
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    ap.add_argument("--fanout", type=int, default=1,
                    help="N > 1: one ringer wakes N waiters and waits for all (zmq: one PUB send "
                         "to N conflated SUBs; eventfd, pipe: N doorbells rung in turn)")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or args.count < 10 or args.busy < 0 or args.fanout < 1:
        ap.error(f"unknown kind {bad[0]!r}" if bad else "--count must be >= 10, --busy >= 0, --fanout >= 1")
    spinners = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        if args.fanout > 1:
            results = {k: summary(run_fanout(k, args.count, args.fanout)) for k in kinds if k in FANOUT_KINDS}
        else:
            results = {k: summary(run_kind(k, args.count)) for k in kinds}
    finally:
        for p in spinners:
            p.kill()
            p.join()
    if args.json:
        print(json.dumps({"count": args.count, "busy": args.busy, "fanout": args.fanout, "round_trip": results}))
    else:
        what = (f"ring {args.fanout} waiters, until all answered" if args.fanout > 1
                else "one round trip (two wake-ups)")
        print(f"{what}, {args.count} each, {args.busy} busy process(es)")
        print(f"{'kind':8} {'p50 µs':>8} {'p99 µs':>8} {'mean µs':>8}")
        for k, r in results.items():
            print(f"{k:8} {r['p50_us']:8.1f} {r['p99_us']:8.1f} {r['mean_us']:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
