"""A ONE-member group whose store holds a damaged committed entry refuses to start (contract
C6): there is no peer to repair it from (a member of a larger group repairs instead:
test_repair_from_peers.py). The handler stops fatally with one line naming the store and the
entry, and the supervisor stops the node — no restart loop, no half-alive node."""

import os
import signal
import subprocess
import sys
import time

from cluster import ROOT

from node.store.base import StoreConfig
from node.store.layout import DATA_DIR, list_segments
from node.store.segment_store import SegmentStore
from node.wiring.ports import free_port_pairs


def test_a_damaged_committed_entry_stops_the_server_in_one_line(tmp_path):
    store = tmp_path / "n0"
    s = SegmentStore(StoreConfig(str(store), data_file_size=1 << 16, index_file_size=1 << 12))
    s.open()
    for i in range(5):
        s.append_leader(b"committed-entry-%d-" % i + b"x" * 100, 1)
    s.set_committed_index(4)
    s.flush()
    pos = 2 * s.get_raw(0, 1, 1 << 20)[0].nbytes  # entries are the same size: where entry 2 starts
    s.close()
    data = list_segments(store / DATA_DIR)[0].path
    raw = bytearray(data.read_bytes())
    raw[pos + 80] ^= 0xFF  # a byte of entry 2's body: its CRC no longer matches
    data.write_bytes(bytes(raw))
    port = free_port_pairs(1)[0]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "server", "--id", "n0", "--peers",
                             f"n0-127.0.0.1:{port}", "--store-dir", str(store), "--data-file-size",
                             str(1 << 16), "--index-file-size", str(1 << 12),
                             "--max-body-size", str(1 << 12)], cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1, err
    assert time.monotonic() - t0 < 15, "the refusal took too long"
    lines = [ln for ln in err.splitlines() if ln.startswith("dledger server: error:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("dledger server: error: handler: "), lines[0]
    assert str(store) in lines[0] and "committed entry 2" in lines[0], lines[0]
    assert "Traceback" not in err
