"""What CurveZMQ costs per frame, without DLedger: a DEALER streams frames to a ROUTER over
loopback TCP (pipelined, `--window` in flight, each answered by a 1-byte reply), plain and then
CURVE (`ipc.security`, a ZAP handler admitting the client's key), one process, one I/O thread
per side. Prints one JSON object per (mode, size): frames/s and MB/s.

Why: `dledger bench` plain vs secure mixes the crypto with everything else a group does; this
isolates the per-byte and per-frame price of encryption (docs/performance.md "Security").

  .venv/bin/python -m tools.bench.curve --sizes 1024,65536 --seconds 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time

import zmq

from ipc.security import Zap, client_curve, keygen, load_server_keys
from ipc.sockets import dealer, router


def _serve(ctx: zmq.Context, sock: zmq.Socket, stop: threading.Event) -> None:
    while not stop.is_set():
        if sock.poll(50):
            ident, _frame = sock.recv_multipart()
            sock.send_multipart((ident, b"k"))


def run(size: int, seconds: float, window: int, secure: bool) -> dict[str, float | str | int]:
    ctx = zmq.Context()
    zap = None
    try:
        with tempfile.TemporaryDirectory() as d:
            keygen(d, "n0")
            keygen(d + "/clients", "c")
            with open(d + "/clients/rights", "w") as f:
                f.write("c write\n")
            curve_s = curve_c = None
            if secure:
                keys = load_server_keys(d, "n0", ["n0"])
                zap = Zap(ctx, keys)
                curve_s = (keys, "data")
                curve_c = (client_curve(d + "/clients/c.key_secret", {"n0": keys.public}), "n0")
            srv = router(ctx, "tcp://127.0.0.1:0", curve=curve_s)
            endpoint = srv.getsockopt_string(zmq.LAST_ENDPOINT)
            stop = threading.Event()
            t = threading.Thread(target=_serve, args=(ctx, srv, stop), daemon=True)
            t.start()
            cli = dealer(ctx, endpoint, curve=curve_c)
            while not cli.poll(0, zmq.POLLOUT):
                time.sleep(0.01)
            body = b"x" * size
            sent = done = 0
            end = time.perf_counter() + seconds
            t0 = time.perf_counter()
            while time.perf_counter() < end or done < sent:
                while sent - done < window and time.perf_counter() < end:
                    try:
                        cli.send(body, zmq.NOBLOCK)
                        sent += 1
                    except zmq.Again:
                        break
                if cli.poll(1000):
                    cli.recv()
                    done += 1
                elif sent > done:
                    raise RuntimeError("no reply within 1 s")
            span = time.perf_counter() - t0
            stop.set()
            t.join(2)
            cli.close(0)
            srv.close(0)
    finally:
        if zap is not None:
            zap.stop()
        ctx.destroy(0)
    return {"mode": "curve" if secure else "plain", "size": size, "frames_per_s": round(done / span),
            "mb_per_s": round(done * size / span / 1e6, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1024,65536", help="frame sizes in bytes, comma-separated")
    p.add_argument("--seconds", type=float, default=2.0, help="per (mode, size)")
    p.add_argument("--window", type=int, default=64, help="frames in flight")
    a = p.parse_args()
    for size in (int(x) for x in a.sizes.split(",")):
        for secure in (False, True):
            print(json.dumps(run(size, a.seconds, a.window, secure)), flush=True)


if __name__ == "__main__":
    main()
