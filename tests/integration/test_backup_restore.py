"""Backup and restore as docs/operations.md "Backup and restore" writes it: the procedure's
commands run as printed (with the variables filled in) against a real group, and the new group
holds the same committed entries — bodies, terms, types and session stamps — and takes new
appends; a KV group's state comes back by replay; bad uses are one line."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import ROOT, wait_for

from ipc.client import DLedgerClient, KVClient
from node.wiring.ports import free_port_pairs

DOC = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")


def procedure() -> list[str]:
    block = re.search(r"<!-- backup-procedure -->\n```\n(.*?)```", DOC, re.S)
    assert block, "docs/operations.md lost its backup procedure"
    return [ln for ln in block.group(1).splitlines() if ln.strip()]


def run_procedure(peers: str, backup: Path, new: Path, new_peers: str) -> list[subprocess.Popen]:
    """Each line of the procedure, its variables filled in: `dledger ...` through the CLI, a
    trailing `&` started in the background (returned, for the caller to stop)."""
    env_vars = {"PEERS": peers, "BACKUP": str(backup), "NEW": str(new), "NEW_PEERS": new_peers}
    servers = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for line in procedure():
        background = line.rstrip().endswith("&")
        argv = shlex.split(line.rstrip(" &"))
        argv = [re.sub(r"\$(\w+)", lambda m: env_vars[m.group(1)], a) for a in argv]
        assert argv[0] == "dledger"
        cmd = [sys.executable, "-m", "tools.cli", *argv[1:]]
        if background:
            servers.append(subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True))
        else:
            r = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (line, r.stdout, r.stderr)
    return servers


def stop(servers: list[subprocess.Popen]) -> None:
    for p in servers:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in servers:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def stamps(store_dir: Path) -> list[tuple[int, int, int, bytes, int]]:
    """(index, term, magic, body, session) of every entry of a stopped node's store."""
    from ipc.entry_codec import HEADER, iter_entries
    from node.store.base import StoreConfig
    from node.store.layout import read_layout
    from node.store.segment_store import SegmentStore

    lay = read_layout(store_dir)
    st = SegmentStore(StoreConfig(store_dir=str(store_dir), data_file_size=lay.data_file_size,
                                  index_file_size=lay.index_file_size))
    st.open()
    out = []
    try:
        i = st.ledger_begin_index
        while 0 <= i <= st.ledger_end_index:
            blob, n = st.get_raw(i, st.ledger_end_index - i + 1, 1 << 20)
            for off, e in iter_entries(blob):
                out.append((e.index, e.term, e.magic, bytes(e.body), HEADER.unpack_from(blob, off)[5]))
            i += n
    finally:
        st.close()
    return out


def new_peers() -> str:
    return ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(free_port_pairs(3)))


def test_the_documented_procedure_restores_the_log_into_a_new_group(make_cluster, tmp_path):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    with DLedgerClient(c.peers, timeout=15.0) as dc:  # sessions on: entries carry stamps
        for i in range(20):
            dc.append_batch([b"b%d-%d" % (i, k) for k in range(50)])
        last = dc.append(b"last").index
        old = [(e.index, e.term, e.type, e.body) for e in dc.get_range(0, last + 1)]
    peers2 = new_peers()
    servers = run_procedure(c.peers, tmp_path / "backup", tmp_path / "new", peers2)
    try:
        with DLedgerClient(peers2, timeout=15.0) as nc:
            got = wait_for(lambda: nc.get_range(0, last + 1), 60, "the new group to serve")
            assert [(e.index, e.term, e.type, e.body) for e in got] == old
            r = nc.append(b"after the restore")
            assert r.index > last and r.term > got[-1].term
    finally:
        stop(servers)
    # The session stamps came along: every NORMAL entry the old group wrote has one.
    for i in range(3):
        assert [x[:4] for x in stamps(tmp_path / "new" / f"n{i}")][:len(old)] == \
            [(e[0], e[1], 1 if e[2] == "NORMAL" else 2, e[3]) for e in old]
        assert all(sid != 0 for _i, _t, magic, _b, sid in stamps(tmp_path / "new" / f"n{i}")[:len(old)]
                   if magic == 1)


def test_a_kv_group_comes_back_with_its_state(make_cluster, tmp_path):
    c = make_cluster(3, state_machine="kv")
    c.wait_leader(timeout=15)
    with KVClient(c.peers, timeout=15.0) as kv:
        for i in range(30):
            kv.put(b"k%d" % (i % 7), b"v%d" % i)
        want = {kv_.key: kv_.value for kv_ in kv.scan(b"")}
    backup = tmp_path / "backup"
    r = subprocess.run([sys.executable, "-m", "tools.cli", "backup", "--peers", c.peers, "--out", str(backup),
                        "--json"], cwd=str(ROOT), capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert '"state_machine": true' in r.stdout
    peers2 = new_peers()
    servers = []
    try:
        for i in range(3):
            from tools.backup import restore
            restore(backup, tmp_path / "new" / f"n{i}")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for i in range(3):
            servers.append(subprocess.Popen(
                [sys.executable, "-m", "tools.cli", "server", "--id", f"n{i}", "--peers", peers2, "--store-dir",
                 str(tmp_path / "new" / f"n{i}"), "--state-machine", "kv"], cwd=str(ROOT), env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        with KVClient(peers2, timeout=15.0) as kv:
            wait_for(lambda: {x.key: x.value for x in kv.scan(b"")} == want, 60, "the restored state")
    finally:
        stop(servers)


@pytest.mark.parametrize("args, says", [
    (["restore", "--from", "{tmp}/nothing", "--store-dir", "{tmp}/n0"], "is not a backup: no backup.json"),
])
def test_bad_restores_are_one_line(tmp_path, args, says):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    (tmp_path / "nothing").mkdir()
    r = subprocess.run([sys.executable, "-m", "tools.cli", *argv], cwd=str(ROOT), capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "n0").exists() or not any((tmp_path / "n0").iterdir())
