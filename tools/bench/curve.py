"""What CurveZMQ costs per frame, without DLedger: a DEALER streams frames to a ROUTER over
loopback TCP (pipelined, `--window` in flight, each answered by a 1-byte reply), one process,
one I/O thread per side, in three modes:

* `plain`: no security;
* `curve`: CURVE (`ipc.security`, a ZAP handler admitting the client's key): every frame
  encrypted and authenticated by libzmq (libsodium's XSalsa20-Poly1305) in its I/O threads;
* `mac`: plain sockets, each frame authenticated (not encrypted) in Python by a keyed
  HMAC-SHA256 over a counter and the frame, checked by the receiver with the counter rising:
  the alternative to encrypting peer links (authenticate each frame with a key the two
  members exchanged over CURVE).

Prints one JSON object per (mode, size): frames/s, MB/s, and the CPU the process spent per
frame (every thread: Python's and libzmq's I/O threads), the figure that decides on a machine
whose cores are all busy.

Why: `dledger bench` plain vs secure mixes the crypto with everything else a group does; this
isolates the per-byte and per-frame price of encryption, and of the cheaper-looking
alternative (docs/performance.md "Plain vs secure").

  .venv/bin/python -m tools.bench.curve --sizes 1024,65536 --seconds 2
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import struct
import tempfile
import threading
import time

import zmq

from ipc.security import Zap, client_curve, keygen, load_server_keys
from ipc.sockets import dealer, router

MODES = ("plain", "curve", "mac")
MAC_KEY_BYTES = 32
COUNTER = struct.Struct(">Q")


def mac_tag(key: bytes, counter: int, frame: bytes | memoryview) -> bytes:
    """The `mac` mode's first frame: the counter, then HMAC-SHA256(key, counter || frame)."""
    c = COUNTER.pack(counter)
    h = hmac.new(key, c, "sha256")
    h.update(frame)
    return c + h.digest()


def mac_check(key: bytes, tag: bytes, frame: bytes | memoryview, last: int) -> int:
    """The counter of a frame whose tag is right and whose counter rose past `last` (a replayed
    frame does not); ValueError otherwise."""
    counter = COUNTER.unpack_from(tag)[0]
    h = hmac.new(key, tag[:COUNTER.size], "sha256")
    h.update(frame)
    if counter <= last or not hmac.compare_digest(h.digest(), tag[COUNTER.size:]):
        raise ValueError("a frame with a wrong tag or a replayed counter")
    return counter


def _serve(ctx: zmq.Context, sock: zmq.Socket, stop: threading.Event, key: bytes | None) -> None:
    last = 0
    while not stop.is_set():
        if sock.poll(50):
            parts = sock.recv_multipart(copy=False)
            if key is not None:
                last = mac_check(key, parts[1].bytes, parts[2].buffer, last)
            sock.send_multipart((parts[0], b"k"))


def run(size: int, seconds: float, window: int, mode: str) -> dict[str, float | str | int]:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    secure = mode == "curve"
    key = os.urandom(MAC_KEY_BYTES) if mode == "mac" else None
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
            t = threading.Thread(target=_serve, args=(ctx, srv, stop, key), daemon=True)
            t.start()
            cli = dealer(ctx, endpoint, curve=curve_c)
            while not cli.poll(0, zmq.POLLOUT):
                time.sleep(0.01)
            body = b"x" * size
            sent = done = 0
            end = time.perf_counter() + seconds
            t0, cpu0 = time.perf_counter(), time.process_time()
            while time.perf_counter() < end or done < sent:
                while sent - done < window and time.perf_counter() < end:
                    try:
                        if key is not None:
                            cli.send_multipart((mac_tag(key, sent + 1, body), body), zmq.NOBLOCK)
                        else:
                            cli.send(body, zmq.NOBLOCK)
                        sent += 1
                    except zmq.Again:
                        break
                if cli.poll(1000):
                    cli.recv()
                    done += 1
                elif sent > done:
                    raise RuntimeError("no reply within 1 s")
            span, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            stop.set()
            t.join(2)
            cli.close(0)
            srv.close(0)
    finally:
        if zap is not None:
            zap.stop()
        ctx.destroy(0)
    return {"mode": mode, "size": size, "frames_per_s": round(done / span),
            "mb_per_s": round(done * size / span / 1e6, 1), "cpu_us_per_frame": round(cpu / max(done, 1) * 1e6, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1024,65536", help="frame sizes in bytes, comma-separated")
    p.add_argument("--seconds", type=float, default=2.0, help="per (mode, size)")
    p.add_argument("--window", type=int, default=64, help="frames in flight")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    a = p.parse_args()
    modes = a.modes.split(",")
    if any(m not in MODES for m in modes):
        p.error(f"--modes: each one of {', '.join(MODES)}")
    for size in (int(x) for x in a.sizes.split(",")):
        for mode in modes:
            print(json.dumps(run(size, a.seconds, a.window, mode)), flush=True)


if __name__ == "__main__":
    main()
