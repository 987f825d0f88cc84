"""`server --join PEERS --address HOST:PORT` (node/config.py): the derived peers, the bootstrap
configuration without this node, and one line per mistake."""

from __future__ import annotations

import pytest

from node.config import ConfigError, NodeConfig
from node.core.membership import bootstrap_configuration

JOIN = "n0-127.0.0.1:20000;n1-127.0.0.1:20002"


def test_a_joining_node_is_in_its_peers_but_not_in_its_bootstrap_configuration() -> None:
    c = NodeConfig(id="n9", join=JOIN, join_address="127.0.0.1:20010", store_dir="/tmp/x")
    c.validate()
    assert c.peers == f"{JOIN};n9-127.0.0.1:20010" and c.address == ("127.0.0.1", 20010)
    assert list(c.bootstrap_members) == ["n0", "n1"]
    assert bootstrap_configuration(c.bootstrap_members).member("n9") is None  # stands for nothing
    again = NodeConfig.from_json(c.to_json())  # what every role reads from the run directory
    again.validate()
    assert again.peers == c.peers and list(again.bootstrap_members) == ["n0", "n1"]
    member = NodeConfig(id="n0", peers=JOIN, store_dir="/tmp/x")
    assert list(member.bootstrap_members) == ["n0", "n1"]  # a member's is its --peers


@pytest.mark.parametrize(("kw", "says"), [
    ({"join_address": "127.0.0.1:1", "peers": JOIN + ";n9-127.0.0.1:20010"}, "only with --join"),
    ({"join": JOIN}, "--address HOST:PORT is required with --join"),
    ({"join": JOIN, "join_address": "nowhere"}, "join_address:"),
    ({"join": JOIN, "join_address": "127.0.0.1:20000"}, "the same address"),
    ({"join": "n9-127.0.0.1:20000", "join_address": "127.0.0.1:2"}, "already a member there"),
    ({"join": JOIN, "join_address": "127.0.0.1:20010", "peers": "n9-127.0.0.1:20010"}, "not both"),
    ({"join": "garbage", "join_address": "127.0.0.1:20010"}, "join:"),
])
def test_join_mistakes_are_one_line_each(kw: dict, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        NodeConfig(id="n9", store_dir="/tmp/x", **kw).validate()
    assert any(says in p for p in e.value.problems), e.value.problems
