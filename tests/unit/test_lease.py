"""The leader lease (node/core/lease.py, docs/contracts.md C3)."""

import pytest

from ipc.codes import Role
from node.core.election_types import ElectionConfig
from node.core.lease import holds_lease, lease_ms


@pytest.mark.parametrize("interval, leak", [(200, 3), (10, 2), (150, 5), (2000, 3)])
def test_lease_is_shorter_than_the_election_timeout_by_half_an_interval(interval, leak):
    cfg = ElectionConfig(heartbeat_interval_ms=interval, max_heartbeat_leak=leak)
    n = lease_ms(cfg)
    assert 0 < n < cfg.election_timeout_ms
    assert cfg.election_timeout_ms - n == interval // 2
    assert n > interval  # a healthy leader renews it every interval with room to spare


def test_default_lease_is_350_ms():
    # heartbeat 100 ms x leak 4: election timeout 400 ms, lease 400 - 50
    assert lease_ms(ElectionConfig()) == 350 < ElectionConfig().election_timeout_ms


@pytest.mark.parametrize("role, last, now, held", [
    (Role.LEADER, 1000, 1000, True),
    (Role.LEADER, 1000, 1499, True),
    (Role.LEADER, 1000, 1500, False),  # expired exactly at the lease
    (Role.LEADER, 1000, 990, True),  # clock read just before the elector's write
    (Role.FOLLOWER, 1000, 1001, False),
    (Role.CANDIDATE, 1000, 1001, False),
    (Role.LEADER, 0, 100, True),  # a virtual clock starting at 0 is a clock like any other
    (Role.LEADER, 0, 10_000_000, False),  # a block never written, real monotonic clock
])
def test_holds_lease(role, last, now, held):
    assert holds_lease(role, last, now, 500) is held
