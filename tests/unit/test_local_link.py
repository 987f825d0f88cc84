"""ipc/local_link.py (a local client's end) and node/wiring/local_clients.py (the handler's),
in real files: the registration in the run directory, the segment in /dev/shm, the doorbells.
A killed client's leftovers are removed; a broken ring detaches its link only."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from ipc.doorbells import Doorbell
from ipc.local_link import (
    REQUEST_BELL,
    SEGMENT_PREFIX,
    SHM_DIR,
    LocalLink,
    LocalLinkError,
    segment_path,
)
from node.wiring import channels
from node.wiring.local_clients import LocalClients

LOG = logging.getLogger("test.local_link")


def _segments() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(SEGMENT_PREFIX)}


@pytest.fixture
def node(tmp_path: Path):
    """A store directory whose run.json names a run directory, the handler's bell and its
    LocalClients; everything checked closed and removed at the end."""
    run, store = tmp_path / "run", tmp_path / "store"
    run.mkdir()
    store.mkdir()
    (store / "run.json").write_text(json.dumps({"run_dir": str(run), "id": "n0", "group": "g"}))
    before = _segments()
    bell = Doorbell.open(run / REQUEST_BELL)
    clients = LocalClients(run, LOG)
    try:
        yield store, run, bell, clients
    finally:
        clients.close()
        bell.close()
    assert _segments() == before


def test_the_bell_names_agree() -> None:
    assert channels.LOCAL_BELL.file_name() == REQUEST_BELL


def test_a_request_and_its_reply_cross_the_link(node) -> None:
    store, run, bell, clients = node
    link = LocalLink(store)
    try:
        assert bell.drain() == 1  # the link announced itself
        clients.scan()
        assert list(clients.links) == [link.ident]
        link.send(b"request")
        assert bell.drain() == 1
        got = clients.requests()
        assert got == [(link.ident, b"request")]
        clients.reply(link.ident, b"reply")
        assert link.recv() == b"reply"
        with pytest.raises(zmq.Again):  # nothing else waits: the DEALER's answer
            link.recv()
    finally:
        link.close()
    clients.scan()
    assert clients.links == {}
    assert os.listdir(run / "local") == []


def test_frames_arrive_in_order_and_whole(node) -> None:
    store, _run, _bell, clients = node
    link = LocalLink(store)
    try:
        clients.scan()
        frames = [bytes([i % 256]) * (i * 37 % 70_000) for i in range(300)]
        for f in frames:
            link.send(f)
        assert [f for _i, f in clients.requests()] + [f for _i, f in clients.requests()] == frames
        for f in frames:
            clients.reply(link.ident, f)
        assert [link.recv() for _ in frames] == frames
    finally:
        link.close()


def test_no_node_running_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalLinkError, match="no node is running"):
        LocalLink(tmp_path)


def test_a_killed_client_is_detached_and_its_files_removed(node) -> None:
    store, run, _bell, clients = node
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from ipc.local_link import LocalLink; "
         f"LocalLink({str(store)!r}); print('linked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout.readline().strip() == b"linked"
        clients.scan()
        assert len(clients.links) == 1
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    clients.check_alive(now_ms=10**12)
    assert clients.links == {}
    assert os.listdir(run / "local") == []
    assert not any(n.startswith(f"{SEGMENT_PREFIX}{child.pid}-") for n in _segments())


def test_leftovers_of_a_dead_client_found_at_start_are_removed(node) -> None:
    store, run, _bell, _clients = node
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"{dead.pid}-0123456789abcdef"
    Path(segment_path(name)).write_bytes(b"")
    os.mkfifo(run / "local" / f"{name}.bell")
    again = LocalClients(run, LOG)  # a restarted handler: sweeps, then scans
    try:
        again.scan()
        assert again.links == {}
        assert not Path(segment_path(name)).exists()
        assert os.listdir(run / "local") == []
    finally:
        again.close()


def test_a_broken_ring_detaches_that_link_only(node) -> None:
    store, _run, _bell, clients = node
    good, bad = LocalLink(store), LocalLink(store)
    try:
        clients.scan()
        assert len(clients.links) == 2
        bad.segment.requests.words[8] = 1 << 40  # its tail, far past anything written
        good.send(b"still served")
        assert clients.requests() == [(good.ident, b"still served")]
        assert list(clients.links) == [good.ident]
    finally:
        good.close()
        bad.close()


def test_a_reply_to_a_client_that_stopped_reading_is_dropped_and_counted(node) -> None:
    store, _run, _bell, clients = node
    link = LocalLink(store)
    try:
        clients.scan()
        big = b"r" * (1 << 20)
        sent = 0
        while clients.dropped_replies == 0:
            clients.reply(link.ident, big)
            sent += 1
            assert sent < 100
        assert sent >= 8
    finally:
        link.close()


def test_a_run_directory_without_room_for_links_disables_them_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "local").write_text("a file where the link directory goes")
    clients = LocalClients(tmp_path, LOG)
    assert clients.disabled
    clients.scan()
    assert clients.links == {} and clients.requests() == []
    clients.close()
