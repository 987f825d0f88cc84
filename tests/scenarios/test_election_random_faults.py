"""Many seeded runs of the simulated cluster under random faults (crash/restart, partitions,
pauses, message loss, latency spikes). The simulator checks the safety invariants on every
effect (at most one leader per term ever; one vote per node per term, across restarts; terms
never go back; votes durable before the ACCEPT leaves). After the faults stop, the group must
elect a leader within a bounded simulated time and then stay stable.

A failure prints the seed; replay it with ``Sim(n, seed=...)`` and the same schedule.
"""

from __future__ import annotations

import random
import statistics

import pytest
from election_sim import Sim

SEEDS = range(200)
HEAL_BOUND_MS = 6_000  # after all faults stop: leader within this much simulated time
STABLE_MS = 5_000  # ...and then no role change at all for this long
QUIET_BY_MS = 20_000  # the quiet window must have started by then


def _random_faults(sim: Sim, rnd: random.Random, duration_ms: int) -> None:
    end = sim.now + duration_ms
    while sim.now < end:
        sim.run(rnd.randint(100, 1200))
        fault = rnd.randrange(8)
        alive = [i for i in sim.ids if sim.nodes[i].alive]
        dead = [i for i in sim.ids if not sim.nodes[i].alive]
        if fault == 0 and alive:
            sim.crash(rnd.choice(alive))
        elif fault == 1 and dead:
            sim.restart(rnd.choice(dead))
        elif fault == 2:
            ids = sim.ids[:]
            rnd.shuffle(ids)
            cut = rnd.randint(1, len(ids) - 1)
            sim.partition(ids[:cut], ids[cut:])
        elif fault == 3:
            sim.heal()
        elif fault == 4 and alive:
            sim.pause(rnd.choice(alive), rnd.randint(50, 1500))
        elif fault == 5:
            sim.drop = rnd.choice([0.0, 0.05, 0.3])
        elif fault == 6:
            sim.latency = rnd.choice([(1, 10), (5, 80), (1, 250)])
        elif fault == 7:
            sim.append(rnd.randint(1, 5))


def _heal_all(sim: Sim) -> None:
    sim.heal()
    sim.drop = 0.0
    sim.latency = (1, 10)
    for i in sim.ids:
        sim.restart(i)
        sim.nodes[i].paused_until = 0


@pytest.mark.parametrize("chunk", range(4))
def test_random_faults_safety_and_liveness(chunk: int) -> None:
    # 4 chunks x 50 seeds keep each test short and report progress.
    for seed in [s for s in SEEDS if s % 4 == chunk]:
        rnd = random.Random(seed)
        n = rnd.choice([3, 3, 5])
        sim = Sim(n, seed=seed, noop=rnd.random() < 0.5)
        _random_faults(sim, rnd, 6_000)
        _heal_all(sim)
        healed_at = sim.now
        took = sim.stabilize(HEAL_BOUND_MS)
        assert took is not None, f"seed {seed}: no leader {HEAL_BOUND_MS}ms after healing\n" \
            + "\n".join(sim.trace[-40:] + sim.status())
        # Aftershocks are allowed (a node that was paused or partitioned times out once), but
        # a quiet window of STABLE_MS with one agreed leader must begin within QUIET_BY_MS.
        while True:
            before = sim.role_changes
            sim.run(STABLE_MS)
            if sim.role_changes == before and sim.leader() is not None:
                break
            assert sim.now - healed_at <= QUIET_BY_MS, f"seed {seed}: never stable\n" \
                + "\n".join(sim.trace[-30:])
            sim.stabilize(HEAL_BOUND_MS)
        assert len(sim.leaders) >= 1


def test_failover_after_leader_crash_is_fast() -> None:
    """The SIGKILL target (new leader within 1.5 s) under the default timings, 3 nodes."""
    times = []
    for seed in range(100):
        sim = Sim(3, seed=1000 + seed)
        assert sim.stabilize(5_000) is not None
        sim.run(random.Random(seed).randint(0, 1000))  # crash at a random heartbeat phase
        old = sim.leader()
        assert old is not None
        sim.crash(old)
        took = sim.stabilize(5_000)
        assert took is not None and sim.leader() != old
        times.append(took)
    assert max(times) <= 1_500, sorted(times)[-10:]
    assert statistics.median(times) <= 1_100, statistics.median(times)


def test_healthy_group_never_changes_leader() -> None:
    """60 s of simulated healthy operation with jittery latency: zero leader changes."""
    for seed in range(10):
        sim = Sim(3, seed=seed, latency=(1, 40))
        assert sim.stabilize(5_000) is not None
        before = sim.role_changes
        sim.run(60_000)
        assert sim.role_changes == before, "\n".join(sim.trace[-10:])
