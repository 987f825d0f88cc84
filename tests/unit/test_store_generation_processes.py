"""The generation fence between two real processes: a writer truncating and re-appending
(deleting and re-creating segment files under the same names) while a reader in another
process reads runs with begin/validate. Every read that validates must be exactly the log the
writer published with that generation — never a replaced file's bytes, never a torn mix.
"""

from __future__ import annotations

import json
import os
import random
import time

from child_process import Child

from node.store.segment_store import SegmentStore, StoreConfig

READER = r"""
import json, sys, time
from node.store import codec
from node.store.reader import StaleRead, StoreReader

store_dir, published, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
r = StoreReader(store_dir)
ok = stale = 0
bad = []
print("ready", flush=True)
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    try:
        with open(published) as fh:
            snap = json.load(fh)
    except (FileNotFoundError, ValueError):
        continue
    gen, truth = snap["gen"], snap["entries"]
    end = len(truth) - 1
    if end < 0:
        continue
    got = []
    try:
        r.begin(gen)
        i = 0
        try:
            while i <= end:
                blob, n, recs = r.get_run(i, end, 16, 1 << 20)
                got.extend(bytes(e.body[:24]) for _o, e in codec.iter_entries(blob, verify_crc=False))
                i += n
        except codec.CodecError as e:
            # bytes zeroed by a truncation racing the read: only validate() may excuse it
            r.validate(gen)
            bad.append((gen, "undecodable although validated: %s" % e))
            continue
        r.validate(gen)
    except StaleRead:
        stale += 1
        continue
    want = [b"%d/%d/%d/" % (k, t, ep) for k, (t, ep) in enumerate(truth)]
    got = [g[:len(w)] for g, w in zip(got, want)]
    if got != want:
        bad.append((gen, next(k for k, (g, w) in enumerate(zip(got, want)) if g != w)))
    ok += 1
print("done", ok, stale, json.dumps(bad[:5]), flush=True)
"""


def _publish(path, gen, entries):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"gen": gen, "entries": entries}, fh)
    os.replace(tmp, path)


def test_a_reader_process_never_validates_bytes_of_another_generation(tmp_path, children):
    store_dir, published = tmp_path / "store", tmp_path / "published.json"
    s = SegmentStore(StoreConfig(store_dir=str(store_dir), data_file_size=4096, index_file_size=8 * 32))
    s.open()
    entries: list[list[int]] = []  # [term, epoch] per index: what the published log holds
    rnd = random.Random(11)
    term, epoch = 1, 0

    def append(k):
        for _ in range(k):
            i = len(entries)
            s.append_leader(b"%d/%d/%d/" % (i, term, epoch) + b"p" * rnd.randrange(0, 600), term)
            entries.append([term, epoch])

    try:
        append(20)
        _publish(published, s.generation, entries)
        c = Child(READER, str(store_dir), str(published), "2.0")
        children.append(c)
        assert c.line() == "ready"
        deadline = time.monotonic() + 2.0
        truncations = 0
        while time.monotonic() < deadline:
            if len(entries) > 6 and rnd.random() < 0.4:
                cut = rnd.randrange(1, len(entries))
                s.truncate(cut)  # deletes later files; the appends below re-create them
                del entries[cut:]
                term, epoch = term + 1, epoch + 1
                truncations += 1
            append(rnd.randrange(1, 12))
            if len(entries) > 120:
                s.truncate(10)
                del entries[10:]
                term, epoch = term + 1, epoch + 1
            _publish(published, s.generation, entries)
        line = c.line(timeout=15)
        assert c.finish() == 0, c.stderr()
    finally:
        s.close()
    word, ok, stale, bad = line.split(" ", 3)
    assert word == "done" and truncations > 10
    assert json.loads(bad) == [], f"validated reads of another generation: {bad}"
    assert int(ok) > 20, line  # the reader did read (and validate) a lot
