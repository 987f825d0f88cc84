"""Follower push micro-benchmark: µs per entry of `SegmentStore.append_follower`'s fast path.

    python -m tools.bench.push_check [--sizes 64,4096] [--body 128] [--rounds 5] [--json]
    python -m tools.bench.push_check --implementations [--sizes 16,32,64,72,80,96,128,4096]

Why: the follower checks every pushed entry before storing it (docs/store.md, "Follower
append"); this times that path alone, without sockets or processes, for runs of 64 and 4096
entries of 128 B (the `dledger bench` 128 B line pushes runs in that range). A leader store
writes the entries once; each round opens an empty follower on the same file sizes (so its
positions equal the leader's and every run takes the fast path) and times the
`append_follower` calls only. Two figures per run length, best round of `--rounds`:

* ``append``: the whole `append_follower` call (checks + copy + index write), µs/entry;
* ``check``: `_check_run` alone on the same runs, µs/entry (the part the checks cost).

`--implementations` times the versions of the record/header check instead (the loop, numpy
and the plain-run accept, node/store/push_check.py), µs per call: where the loop and numpy
break even is `NUMPY_MIN_RUN`, where the loop and the plain-run accept do is `PLAIN_MIN_RUN`.

With a store that takes the leader's run CRC (`append_follower(..., run_crc=...)`), it is
passed as the dispatcher computes it (`node.store.codec.push_run_crc`); older stores are
timed without it, so the same script measures before and after.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import tempfile
import time
import timeit

from node.store import codec
from node.store.codec import INDEX_SIZE
from node.store.segment_store import SegmentStore, StoreConfig

FILE_SIZE = 256 << 20
TOTAL_BYTES = 12 << 20  # entries per length: enough runs that one round takes milliseconds


def _config(d: str) -> StoreConfig:
    return StoreConfig(store_dir=d, data_file_size=FILE_SIZE, index_file_size=32 << 20)


def _leader_runs(root: str, n: int, body: int) -> list[tuple[bytes, bytes]]:
    """Consecutive runs of `n` entries as a leader would push them: (blob, index records)."""
    lead = SegmentStore(_config(tempfile.mkdtemp(dir=root)))
    lead.open()
    count = max(4, TOTAL_BYTES // ((codec.HEADER_SIZE + body) * n)) * n
    data = bytes(range(256)) * (body // 256) + bytes(body % 256)
    for k in range(0, count, 64):
        lead.append_batch_raw([data] * min(64, count - k), 1 + k // 1000)
    runs = []
    for first in range(0, count, n):
        blob, got = lead.get_raw(first, n, 1 << 30)
        assert got == n
        runs.append((bytes(blob), bytes(lead.index.read(first * INDEX_SIZE, n * INDEX_SIZE))))
    lead.close()
    return runs


def _run_crc_kw(runs: list[tuple[bytes, bytes]]) -> list[dict[str, int]]:
    """The keyword arguments the handler passes: the run CRC, where the store takes one."""
    takes = "run_crc" in inspect.signature(SegmentStore.append_follower).parameters
    push_crc = getattr(codec, "push_run_crc", None)
    if not (takes and push_crc):
        return [{} for _ in runs]
    return [{"run_crc": push_crc(recs, blob)} for blob, recs in runs]


def _round(root: str, runs: list[tuple[bytes, bytes]], kws: list[dict[str, int]]) -> float:
    d = tempfile.mkdtemp(dir=root)
    f = SegmentStore(_config(d))
    f.open()
    try:
        t0 = time.perf_counter()
        for (blob, recs), kw in zip(runs, kws, strict=True):
            f.append_follower(blob, recs, **kw)
        return time.perf_counter() - t0
    finally:
        f.close()
        shutil.rmtree(d, ignore_errors=True)


def _check_only(root: str, runs: list[tuple[bytes, bytes]], kws: list[dict[str, int]]) -> float:
    d = tempfile.mkdtemp(dir=root)
    f = SegmentStore(_config(d))
    f.open()
    takes = len(inspect.signature(SegmentStore._check_run).parameters) > 4
    try:
        t0 = time.perf_counter()
        for (blob, recs), kw in zip(runs, kws, strict=True):
            args = (memoryview(blob), memoryview(recs), len(recs) // INDEX_SIZE)
            if takes:
                f._check_run(*args, kw.get("run_crc"))
            else:
                f._check_run(*args)
        return time.perf_counter() - t0
    finally:
        f.close()
        shutil.rmtree(d, ignore_errors=True)


def run_case(root: str, n: int, body: int, rounds: int) -> dict[str, float]:
    runs = _leader_runs(root, n, body)
    kws = _run_crc_kw(runs)
    entries = n * len(runs)
    append = min(_round(root, runs, kws) for _ in range(rounds))
    check = (min(_check_only(root, runs, kws) for _ in range(rounds))
             if hasattr(SegmentStore, "_check_run") else float("nan"))  # older stores: no separate check
    return {"run": n, "body": body, "entries": entries, "run_crc": bool(kws[0]),
            "append_us_per_entry": append / entries * 1e6, "check_us_per_entry": check / entries * 1e6}


def compare_implementations(root: str, n: int, body: int, rounds: int) -> dict[str, float]:
    """µs per call of `push_check.check_run_loop`, `check_run_numpy` and `plain_run_ok` (the
    plain-run accept `check_run` tries first from `PLAIN_MIN_RUN` entries) on one clean run."""
    from node.store import push_check

    blob, recs = _leader_runs(root, n, body)[0]
    mv, rv = memoryview(blob), memoryview(recs)
    number = max(20, 20000 // n)
    row: dict[str, float] = {"run": n, "body": body}
    plain = getattr(push_check, "plain_run_ok", None)  # older trees lack it
    impls = [("loop", push_check.check_run_loop), ("numpy", push_check.check_run_numpy)]
    if plain is not None:
        impls.append(("plain", lambda mv, rv, n, _verify: plain(mv, rv, n)))
    for name, fn in impls:
        best = min(timeit.repeat(lambda fn=fn: fn(mv, rv, n, False), number=number, repeat=rounds))
        row[f"{name}_us"] = best / number * 1e6
    return row


def _print_implementations(rows: list[dict[str, float]]) -> None:
    print(f"{'run':>6} {'loop us':>9} {'numpy us':>9} {'plain us':>9} {'loop us/e':>10} "
          f"{'numpy us/e':>11}")
    for r in rows:
        n = r["run"]
        plain = f"{r['plain_us']:>9.1f}" if "plain_us" in r else f"{'-':>9}"
        print(f"{n:>6} {r['loop_us']:>9.1f} {r['numpy_us']:>9.1f} {plain} {r['loop_us'] / n:>10.3f} "
              f"{r['numpy_us'] / n:>11.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.push_check", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,4096", help="run lengths, comma-separated")
    ap.add_argument("--body", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--implementations", action="store_true",
                    help="time the loop and the numpy check per run length instead")
    args = ap.parse_args()
    case = compare_implementations if args.implementations else run_case
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        rows = [case(root, int(n), args.body, args.rounds) for n in args.sizes.split(",")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(rows))
        return
    if args.implementations:
        _print_implementations(rows)
        return
    print(f"{'run':>6} {'body':>5} {'run_crc':>7} {'append us/entry':>16} {'check us/entry':>15}")
    for r in rows:
        print(f"{r['run']:>6} {r['body']:>5} {r['run_crc']!s:>7} {r['append_us_per_entry']:>16.3f} "
              f"{r['check_us_per_entry']:>15.3f}")


if __name__ == "__main__":
    main()
