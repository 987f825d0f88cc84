"""`connect_from_own_host`: a node can connect to its peers from its own address, so routing
rules (dledger chaos partitions) can tell one node's peer traffic from another's."""

import pytest
import zmq

from ipc.sockets import dealer, from_source, router
from node.config import ConfigError, NodeConfig

PEERS = "n0-127.0.0.1:20911;n1-localhost:20913"


def test_from_source_uses_zeromqs_source_form():
    assert from_source("tcp://127.0.0.3:5000", None) == "tcp://127.0.0.3:5000"
    assert from_source("tcp://127.0.0.3:5000", "127.0.0.2") == "tcp://127.0.0.2:0;127.0.0.3:5000"
    assert from_source("tcp://[::1]:5000", "::1") == "tcp://[::1]:0;[::1]:5000"


def test_the_connection_really_comes_from_the_source_address():
    ctx = zmq.Context()
    try:
        r = router(ctx, "tcp://127.0.0.1:*")
        port = int(r.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
        d = dealer(ctx, from_source(f"tcp://127.0.0.1:{port}", "127.0.0.7"))
        d.send(b"hi")
        assert r.poll(5000)
        frames = r.recv_multipart(copy=False)
        assert frames[-1].bytes == b"hi"
        assert frames[-1].get("Peer-Address") == "127.0.0.7"
    finally:
        ctx.destroy(linger=0)


def test_the_option_needs_an_ip_address_as_the_node_host(tmp_path):
    NodeConfig(id="n0", peers=PEERS, store_dir=str(tmp_path), connect_from_own_host=True).validate()
    with pytest.raises(ConfigError, match="connect_from_own_host: this node's host 'localhost'"):
        NodeConfig(id="n1", peers=PEERS, store_dir=str(tmp_path), connect_from_own_host=True).validate()
    NodeConfig(id="n1", peers=PEERS, store_dir=str(tmp_path)).validate()  # off: any host
