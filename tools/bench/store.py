"""Store micro-benchmark: appends/s and MB/s of the segment store in one process.

    python -m tools.bench.store [--seconds 2] [--json]

Runs every combination of body size (128 B, 1 KiB), single vs batch-of-64 appends and
async vs sync flush, on 64 MiB segment files in a temporary directory (on the same filesystem
as --dir, default the system temp dir). Figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

from node.store.segment_store import SegmentStore, StoreConfig


def run_case(root: str, size: int, batch: int, flush_mode: str, seconds: float) -> dict[str, float]:
    d = tempfile.mkdtemp(dir=root)
    try:
        st = SegmentStore(StoreConfig(store_dir=d, data_file_size=64 << 20, index_file_size=32 << 20,
                                      flush_mode=flush_mode))
        st.open()
        body = bytes(range(256)) * (size // 256) + bytes(size % 256)
        bodies = [body] * batch
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            if batch == 1:
                for _ in range(64):
                    st.append_leader(body, 1)
                n += 64
            else:
                st.append_batch_raw(bodies, 1)
                n += batch
            if time.perf_counter() >= deadline:
                break
        dt = time.perf_counter() - t0
        st.close()
        return {"size": size, "batch": batch, "flush": flush_mode, "entries_per_s": n / dt,
                "mb_per_s": n * size / dt / 1e6}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.store", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [run_case(args.dir, size, batch, mode, args.seconds)
            for mode in ("async", "sync") for size in (128, 1024) for batch in (1, 64)]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'body':>6} {'batch':>5} {'flush':>5} {'entries/s':>12} {'MB/s':>8}")
    for r in rows:
        print(f"{r['size']:>6} {r['batch']:>5} {r['flush']:>5} {r['entries_per_s']:>12,.0f} {r['mb_per_s']:>8.1f}")


if __name__ == "__main__":
    main()
