"""Following the log: one reader's rate, and the append rate with 0, 1 and 100 readers attached
(figures for docs/performance.md "Following the log").

    python -m tools.bench.follow [--entries 50000] [--size 1024] [--appends 20000]
                                 [--readers 0,1,100] [--json] [-- server options...]

A 3-node local group. First `--entries` entries of `--size` bytes are appended (batches of
100), then one `DLedgerClient.follow(0)` reads them all back: entries/s of one reader, from a
follower (the client's choice) and pinned to the leader.

Then for each reader count R: R readers long-poll the log's end (FETCH with a 1 s wait, as
`follow` does), spread over the two followers (where `follow` sends them) — and, for the
largest R, once more all on the leader — while one pipelined writer appends `--appends`
entries of `--size` bytes, `append_async` with 256 in flight (what `dledger bench` does).
The readers are raw FETCH loops on DEALER sockets in one separate process, so the node sees
exactly what R followers cost it while the bench's own CPU stays small (100 full clients
would be 100 I/O threads on this 2-core machine). Each reader counts what it received; the
figure is the writer's entries/s, with the nodes' CPU per append. Last, the idle cost: the
group's CPU over `--idle-seconds` with no writes, without readers and with the largest number
of readers held at the end. Every server is stopped at the end, also on errors.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time

from tools.local_group import LocalGroup


def reader_loop(addresses: list[tuple[str, str]], group: str, start: int, stop_at: int,
                ready: mp.Event, done: mp.Event, counts: mp.Array) -> None:
    """One DEALER per reader, each following from `start` with 1 s long polls until `done`."""
    import zmq

    from ipc import protocol as P

    ctx = zmq.Context()
    poller = zmq.Poller()
    socks = []
    nxt = []
    for i, (nid, addr) in enumerate(addresses):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(addr)
        s.send(P.encode(P.FetchRequest(group, nid, start, 1000, 1 << 20, 1000, i)))
        poller.register(s, zmq.POLLIN)
        socks.append((s, nid))
        nxt.append(start)
    ready.set()
    index_of = {s: k for k, (s, _n) in enumerate(socks)}
    while not done.is_set():
        for s, _ev in poller.poll(100):
            k = index_of[s]
            msg = P.decode(s.recv())
            if isinstance(msg, P.FetchResponse):
                n = entry_count(msg.entries)
                nxt[k] += n
                counts[k] += n
            else:
                time.sleep(0.01)
            s.send(P.encode(P.FetchRequest(group, socks[k][1], nxt[k], 1000, 1 << 20, 1000, k)))
    for s, _n in socks:
        s.close()
    ctx.term()


def _cpu(psutil, pid: int) -> float:  # noqa: ANN001
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def entry_count(blob: bytes | memoryview) -> int:
    """Entries in a store-format blob, by their size fields only (the reader's CPU is kept off
    the measurement: a real reader decodes on its own machine)."""
    mv = memoryview(blob)
    off = n = 0
    while off < len(mv):
        off += int.from_bytes(mv[off + 4:off + 8], "big")
        n += 1
    return n


def write(peers: str, n: int, size: int) -> float:
    """Entries/s of a pipelined writer appending `n` entries."""
    from ipc.client import DLedgerClient

    body = b"x" * size
    with DLedgerClient(peers, timeout=30.0, max_in_flight=256) as c:
        c.append(b"warm")
        t0 = time.perf_counter()
        futs = [c.append_async(body) for _ in range(n)]
        for f in futs:
            f.result(60)
        return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--appends", type=int, default=20_000)
    ap.add_argument("--readers", default="0,1,100")
    ap.add_argument("--idle-seconds", type=float, default=5.0,
                    help="idle cost: the group's CPU over this long with no writes, without and "
                         "with the largest number of readers waiting (0: skip)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("server_args", nargs="*")
    args = ap.parse_args(argv)
    from ipc.client import DLedgerClient

    g = LocalGroup(3, args.server_args)
    out: dict[str, object] = {"entries": args.entries, "size": args.size, "appends": args.appends}
    try:
        g.start()
        with DLedgerClient(g.peers, timeout=30.0) as c:
            deadline = time.monotonic() + 60
            while c.metadata().leader_id is None:
                if time.monotonic() > deadline:
                    raise SystemExit("no leader within 60 s")
                time.sleep(0.1)
            leader = c.metadata().leader_id
            body = b"y" * args.size
            for _ in range(args.entries // 100):
                c.append_batch([body] * 100)
            last = c.metadata().nodes[0].committed_index
            for label, pin in (("follower", None), ("leader", leader)):
                t0 = time.perf_counter()
                got = 0
                for e in c.follow(0, read_from=pin):
                    got += 1
                    if e.index >= last:
                        break
                out[f"follow_entries_per_s_from_{label}"] = round(got / (time.perf_counter() - t0))
            end = c.metadata().nodes[0].committed_index + 1
        ids = [i for i in g.ids]
        followers = [i for i in ids if i != leader]
        addr = {nid: f"tcp://{g.hosts[nid]}:{g.ports[ids.index(nid)]}" for nid in ids}
        runs = []
        counts_list = [int(x) for x in args.readers.split(",")]
        for r in counts_list:
            runs.append((r, "followers"))
        if counts_list and max(counts_list) > 0:
            runs.append((max(counts_list), "leader"))
        spawn = mp.get_context("spawn")
        for r, where in runs:
            targets = [leader] * r if where == "leader" else [followers[k % 2] for k in range(r)]
            ready, done = spawn.Event(), spawn.Event()
            counts = spawn.Array("q", max(1, r))
            proc = None
            if r:
                proc = spawn.Process(target=reader_loop, args=([(t, addr[t]) for t in targets], g.group, end,
                                                               0, ready, done, counts))
                proc.start()
                ready.wait(30)
            import psutil

            node_cpu0 = g.cpu_seconds()
            reader_cpu0 = _cpu(psutil, proc.pid) if proc is not None else 0.0
            try:
                t0 = time.perf_counter()
                rate = write(g.peers, args.appends, args.size)
                wall = time.perf_counter() - t0
                node_cpu = g.cpu_seconds() - node_cpu0
                reader_cpu = (_cpu(psutil, proc.pid) - reader_cpu0) if proc is not None else 0.0
            finally:
                done.set()
                if proc is not None:
                    proc.join(10)
                    if proc.is_alive():
                        proc.kill()
            out[f"nodes_cpu_us_per_append_{r}_readers_on_{where}"] = round(node_cpu / args.appends * 1e6)
            out[f"readers_process_cpu_pct_{r}_readers_on_{where}"] = round(100 * reader_cpu / wall)
            received = sum(counts[:r]) if r else 0
            out[f"append_entries_per_s_{r}_readers_on_{where}"] = round(rate)
            out[f"entries_received_{r}_readers_on_{where}"] = received
            end += args.appends + 1
        if args.idle_seconds > 0 and counts_list and max(counts_list) > 0:
            import psutil

            r = max(counts_list)
            for label, n in (("no", 0), (str(r), r)):
                ready, done = spawn.Event(), spawn.Event()
                counts = spawn.Array("q", max(1, n))
                proc = None
                if n:
                    targets = [followers[k % 2] for k in range(n)]
                    proc = spawn.Process(target=reader_loop, args=([(t, addr[t]) for t in targets], g.group,
                                                                   end, 0, ready, done, counts))
                    proc.start()
                    ready.wait(30)
                    time.sleep(1.5)  # past the last write's busy window, readers all held
                cpu0 = g.cpu_seconds()
                time.sleep(args.idle_seconds)
                pct = 100 * (g.cpu_seconds() - cpu0) / args.idle_seconds
                done.set()
                if proc is not None:
                    proc.join(10)
                    if proc.is_alive():
                        proc.kill()
                out[f"idle_group_cpu_pct_{label}_readers"] = round(pct, 2)
    finally:
        g.close()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:48s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
