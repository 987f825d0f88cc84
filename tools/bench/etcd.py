"""The etcd side of `dledger bench --kv`: the same put and linearizable get work against a
3-member etcd 3.4 on 127.0.0.1, one JSON line in the same shape (docs/performance.md).

Not part of the `dledger` package: it runs with a separate interpreter that has grpcio
(prerequisites)::

    apt-get install -y etcd-server etcd-client
    python3 -m venv /tmp/anchors/venv && /tmp/anchors/venv/bin/pip install grpcio
    /tmp/anchors/venv/bin/python tools/bench/etcd.py --op put --clients 1 --duration 10
    /tmp/anchors/venv/bin/python tools/bench/etcd.py --op get --clients 64 --conns 8 --json

Each run starts a fresh 3-member cluster on free loopback ports in a temporary directory
(members die with this process: PDEATHSIG), finds the leader and sends every request to it,
and stops the members by PID at the end (SIGTERM, then SIGKILL after 10 s).

The load: grpc.aio raw calls with hand-encoded
protobuf (no generated stubs), --clients coroutines over --conns channels. Puts are
`KV/Put` of --size-byte values to b"k%07d" % (i % --keys), in key order like ours; gets are
`KV/Range` of one key with `serializable` unset, i.e. **linearizable** (etcd's ReadIndex: the
leader confirms its leadership with a heartbeat round and waits until it has applied its
commit index) -- the same guarantee as our KV gets. `--op get` first puts every key once (64
in flight, not measured) and compares every answer with what was put. After --warmup
seconds it measures for --duration seconds; then a sample of keys is read back and compared
with the newest acknowledged put of each (value and mod_revision).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- protobuf, by hand
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def put_request(key: bytes, value: bytes) -> bytes:
    """etcdserverpb.PutRequest: 1 key, 2 value."""
    return _field(1, key) + _field(2, value)


def range_request(key: bytes) -> bytes:
    """etcdserverpb.RangeRequest with only 1 key: one key, serializable=false (linearizable)."""
    return _field(1, key)


def parse(buf: bytes) -> dict[int, list]:
    """A protobuf message's fields: number -> values (ints for varints, bytes otherwise)."""
    out: dict[int, list] = {}
    i, n = 0, len(buf)

    def varint() -> int:
        nonlocal i
        shift = v = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            if b < 0x80:
                return v
            shift += 7

    while i < n:
        tag = varint()
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            val: int | bytes = varint()
        elif wire == 2:
            ln = varint()
            val = buf[i:i + ln]
            i += ln
        elif wire == 1:
            val, i = buf[i:i + 8], i + 8
        elif wire == 5:
            val, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire}")
        out.setdefault(num, []).append(val)
    return out


def put_revision(resp: bytes) -> int:
    """PutResponse.header (1) .revision (3): the store revision of this put."""
    return parse(parse(resp)[1][0]).get(3, [0])[0]


def range_value(resp: bytes) -> tuple[bytes, int] | None:
    """RangeResponse.kvs (2)[0]: (value (5), mod_revision (3)), None when the key is absent."""
    kvs = parse(resp).get(2)
    if not kvs:
        return None
    kv = parse(kvs[0])
    return kv.get(5, [b""])[0], kv.get(3, [0])[0]


_FILL: dict[int, bytes] = {}


def body(seq: int, size: int) -> bytes:
    """The same values as `dledger bench` (tools/commands/bench.py `_body`): 8-byte seq, fixed fill."""
    head = seq.to_bytes(8, "big")
    if size <= 8:
        return head[-size:] if size else b""
    fill = _FILL.get(size)
    if fill is None:
        fill = _FILL[size] = (bytes(range(256)) * (size // 256 + 1))[: size - 8]
    return head + fill


def pct(vals: list[float], q: float) -> float:
    return vals[min(len(vals) - 1, int(q * len(vals)))] if vals else 0.0


# ---------------------------------------------------------------------------- the cluster
def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Cluster:
    """Three etcd members on loopback; `close()` stops them by PID and removes their data."""

    def __init__(self, n: int = 3, etcd: str = "etcd") -> None:
        self.root = tempfile.mkdtemp(prefix="etcd-bench-")
        ports = _free_ports(2 * n)
        self.client_ports, peer_ports = ports[:n], ports[n:]
        names = [f"m{i + 1}" for i in range(n)]
        cluster = ",".join(f"{m}=http://127.0.0.1:{p}" for m, p in zip(names, peer_ports, strict=True))
        self.procs: list[subprocess.Popen] = []
        for m, cp, pp in zip(names, self.client_ports, peer_ports, strict=True):
            with open(os.path.join(self.root, f"{m}.log"), "ab") as log:
                self.procs.append(subprocess.Popen(
                    [etcd, "--name", m, "--data-dir", os.path.join(self.root, m),
                     "--listen-client-urls", f"http://127.0.0.1:{cp}",
                     "--advertise-client-urls", f"http://127.0.0.1:{cp}",
                     "--listen-peer-urls", f"http://127.0.0.1:{pp}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
                     "--initial-cluster", cluster, "--initial-cluster-token", "bench",
                     "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent))
        self.endpoints = [f"127.0.0.1:{p}" for p in self.client_ports]

    def leader(self, timeout: float = 30.0) -> str:
        """The leader's client endpoint, once every member reports the same leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = subprocess.run(["etcdctl", "--endpoints", ",".join(self.endpoints), "endpoint", "status",
                                "-w", "json"], capture_output=True, text=True,
                               env={**os.environ, "ETCDCTL_API": "3"})
            try:
                st = json.loads(r.stdout) if r.returncode == 0 else []
            except ValueError:
                st = []
            leaders = {e["Status"]["leader"] for e in st}
            if len(st) == len(self.endpoints) and len(leaders) == 1 and 0 not in leaders:
                return next(e["Endpoint"] for e in st
                            if e["Status"]["leader"] == e["Status"]["header"]["member_id"])
            time.sleep(0.2)
        raise RuntimeError(f"etcd: no agreed leader within {timeout}s (logs in {self.root})")

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self.procs:
            with contextlib.suppress(OSError, IndexError, ValueError):
                f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
                total += (int(f[11]) + int(f[12])) / CLK_TCK
        return total

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------------------- the load
class Load:
    def __init__(self, args: argparse.Namespace, endpoint: str) -> None:
        import grpc  # the anchors' venv has it; the project's need not

        self.a = args
        self.chans = [grpc.aio.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])
                      for _ in range(args.conns)]
        self.puts = [c.unary_unary("/etcdserverpb.KV/Put") for c in self.chans]  # bytes in, bytes out
        self.ranges = [c.unary_unary("/etcdserverpb.KV/Range") for c in self.chans]
        self.keys = [b"k%07d" % i for i in range(args.keys)]
        self.last: dict[int, tuple[int, int]] = {}  # key number -> (mod_revision, seq) of the newest put
        self.doubtful: set[int] = set()
        self.lat: list[tuple[float, float]] = []  # (done at, latency s)
        self.errors: list[tuple[float, str]] = []
        self.compared = self.mismatched = 0
        self.seq = 0

    def _record_put(self, k: int, seq: int, resp: bytes) -> None:
        rev = put_revision(resp)
        old = self.last.get(k)
        if old is None or rev > old[0]:
            self.last[k] = (rev, seq)

    async def preload(self) -> None:
        todo = iter(range(len(self.keys)))

        async def worker(w: int) -> None:
            for k in todo:
                seq = self.seq
                self.seq += 1
                resp = await self.puts[w % len(self.puts)](put_request(self.keys[k], body(seq, self.a.size)),
                                                          timeout=self.a.timeout)
                self._record_put(k, seq, resp)

        await asyncio.gather(*(worker(w) for w in range(64)))

    async def run(self) -> float:
        a = self.a
        pc = time.perf_counter
        t0 = pc()
        stop = t0 + a.warmup + a.duration
        first = self.seq

        async def worker(w: int) -> None:
            put, rng = self.puts[w % len(self.puts)], self.ranges[w % len(self.ranges)]
            while pc() < stop and (a.count is None or self.seq - first < a.count):
                seq = self.seq
                self.seq += 1
                k = seq % len(self.keys)
                sent = pc()
                try:
                    if a.op == "put":
                        self._record_put(k, seq, await put(put_request(self.keys[k], body(seq, a.size)),
                                                           timeout=a.timeout))
                    else:
                        got = range_value(await rng(range_request(self.keys[k]), timeout=a.timeout))
                        if got is None:
                            raise LookupError("NOT_FOUND")
                        rev, wseq = self.last[k]
                        self.compared += 1
                        self.mismatched += got != (body(wseq, a.size), rev)
                except Exception as e:  # noqa: BLE001 - every failure is counted by kind
                    if a.op == "put":
                        self.doubtful.add(k)
                    self.errors.append((pc(), type(e).__name__))
                    continue
                now = pc()
                self.lat.append((now, now - sent))

        await asyncio.gather(*(worker(w) for w in range(a.clients)))
        return t0 + a.warmup

    async def verify(self) -> dict:
        sure = sorted(k for k in self.last if k not in self.doubtful)
        sample = random.Random(7).sample(sure, min(self.a.verify_sample, len(sure)))
        bad = 0
        for k in sample:
            rev, seq = self.last[k]
            try:
                got = range_value(await self.ranges[0](range_request(self.keys[k]), timeout=self.a.timeout))
            except Exception:  # noqa: BLE001
                got = None
            bad += got != (body(seq, self.a.size), rev)
        return {"checked": len(sample), "mismatched": bad, "doubtful_keys": len(self.doubtful),
                "gets_compared": self.compared, "gets_mismatched": self.mismatched}

    async def close(self) -> None:
        for c in self.chans:
            await c.close()


async def _bench(args: argparse.Namespace, endpoint: str) -> dict:
    load = Load(args, endpoint)
    try:
        if args.op == "get":
            await load.preload()
        start = await load.run()
        meas = [x for x in load.lat if x[0] >= start]
        errs = [e for e in load.errors if e[0] >= start]
        span = max(max([x[0] for x in meas], default=start) - start, 1e-9)
        lats = sorted(x[1] * 1000 for x in meas)
        verified = await load.verify()
    finally:
        await load.close()
    return {"ops_per_s": len(meas) / span, "mb_per_s": len(meas) * args.size / span / 1e6,
            "p50_ms": pct(lats, 0.5), "p99_ms": pct(lats, 0.99), "p999_ms": pct(lats, 0.999),
            "max_ms": lats[-1] if lats else 0.0, "errors": len(errs),
            "error_kinds": sorted({e[1] for e in errs}),
            "error_rate": len(errs) / (len(meas) + len(errs)) if meas or errs else 0.0,
            "ops": len(meas), "seconds": span, "verified": verified}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bench/etcd.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", choices=("put", "get"), default="put")
    ap.add_argument("--clients", type=int, default=1, help="requests in flight (coroutines)")
    ap.add_argument("--conns", type=int, default=1, help="gRPC channels the clients share")
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes (default 1024)")
    ap.add_argument("--keys", type=int, default=10_000, help="key space (default 10000)")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--count", type=int, default=None, help="ops to send instead of --duration")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--verify-sample", type=int, default=1000)
    ap.add_argument("--etcd", default="etcd", help="the etcd binary")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.clients < 1 or a.conns < 1 or a.keys < 1:
        ap.error("--clients, --conns and --keys must be >= 1")
    cluster = Cluster(3, a.etcd)
    try:
        endpoint = cluster.leader()
        cpu0, t0 = cluster.cpu_seconds(), time.monotonic()
        res = asyncio.run(_bench(a, endpoint))
        res["etcd_cpu_cores"] = (cluster.cpu_seconds() - cpu0) / (time.monotonic() - t0)
    finally:
        cluster.close()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    res["client_cpu_s"] = ru.ru_utime + ru.ru_stime
    res["config"] = {k: getattr(a, k) for k in ("op", "clients", "conns", "size", "keys", "duration",
                                                "count", "warmup")}
    res["leader"] = endpoint
    ok = res["error_rate"] == 0 and res["verified"]["mismatched"] == 0 and not res["verified"]["gets_mismatched"]
    if a.json:
        print(json.dumps(res), flush=True)
    else:
        v = res["verified"]
        print(f"etcd {a.op}: {res['ops_per_s']:,.0f} ops/s  latency p50 {res['p50_ms']:.2f} ms  "
              f"p99 {res['p99_ms']:.2f} ms  errors {res['errors']}  "
              f"verified {v['checked'] - v['mismatched']}/{v['checked']}"
              + (f"  gets compared {v['gets_compared'] - v['gets_mismatched']}/{v['gets_compared']}"
                 if v["gets_compared"] else ""), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
