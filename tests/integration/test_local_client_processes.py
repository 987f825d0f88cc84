"""A local client (DLedgerClient with `local_store_dir`: docs/client.md "Local clients") with real
processes: it reaches the node on its store directory through shared memory, keeps its
exactly-once promise through that node's SIGKILL and restart (the other members over TCP
meanwhile, the new node's link afterwards), and leaves no segment in /dev/shm."""

import os

from cluster import AppendWriter, assert_acked_once_everywhere, wait_for

from ipc.local_link import SEGMENT_PREFIX, SHM_DIR, LocalLink


def _own_segments() -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(f"{SEGMENT_PREFIX}{os.getpid()}-")]


def test_a_local_client_writes_exactly_once_through_its_nodes_kill_and_restart(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    client = c.client(timeout=20.0, local_store_dir=c.nodes[lead].store_dir)
    writers = [AppendWriter(client, "one", 1), AppendWriter(client, "pipe", 16)]
    try:
        wait_for(lambda: all(len(w.acked) > 50 for w in writers), 30, "appends flowing")
        node = client._io.conns.nodes[lead]
        assert isinstance(node.sock, LocalLink), "the local node is not reached through shared memory"
        assert "local client attached" in c.nodes[lead].log_text()
        for _ in range(2):
            counts = [len(w.acked) for w in writers]
            attached = c.nodes[lead].log_text().count("local client attached")
            c.nodes[lead].kill()
            c.wait_leader(timeout=15, among=[x for x in c.nodes if x != lead])
            wait_for(lambda counts=counts: all(len(w.acked) > k + 30 for w, k in zip(writers, counts, strict=True)),
                     30, "appends flowing over TCP to the new leader")
            c.nodes[lead].start()  # (not wait_converged: with writers running ends rarely agree)
            # The client links again to the restarted node (a new run directory) once its old
            # link let a request go unanswered: METADATA asks every member.
            wait_for(lambda attached=attached: client.metadata(timeout=3.0) is not None
                     and c.nodes[lead].log_text().count("local client attached") > attached,
                     40, "the link to the restarted node")
    finally:
        for w in writers:
            w.stop()
        client.close()
    assert _own_segments() == []
    c.wait_converged(timeout=30)
    for w in writers:
        assert not w.errors, f"{w.name}: {w.errors[:3]}"
    for n in c.nodes.values():
        n.stop()
    assert_acked_once_everywhere(c, writers)


def test_a_client_of_a_follower_node_writes_through_the_leader(make_cluster):
    """The link reaches a follower: its appends are redirected to the leader over TCP, its reads
    of the local node still use the link."""
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    follower = next(x for x in c.nodes if x != lead)
    with c.client(local_store_dir=c.nodes[follower].store_dir) as client:
        results = [client.append(b"via-%d" % i) for i in range(20)]
        assert [r.index for r in results] == sorted(r.index for r in results)
        assert isinstance(client._io.conns.nodes[follower].sock, LocalLink)
        assert not isinstance(client._io.conns.nodes[lead].sock, LocalLink)
    assert _own_segments() == []


def test_frames_over_the_links_limit_go_over_tcp_to_the_same_node(make_cluster):
    """A batch larger than a ring takes (16 MiB) is sent on the node's DEALER; answers that fit
    (a GET of a 4 MiB entry) come through the link."""
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    big = [bytes([i]) * ((4 << 20) - 1024) for i in range(5)]  # ~20 MiB in one frame
    with c.client(local_store_dir=c.nodes[lead].store_dir, timeout=30.0) as client:
        assert isinstance(client._io.conns.nodes[lead].sock, LocalLink)
        first = client.append_batch(big)[0].index
        assert [client.get(first + i).body for i in range(5)] == big
        assert client.append(b"small").index >= first + 5  # past a NOOP if the load cost a term
    assert _own_segments() == []
