"""The simulator with state machines (`--state-machine kv|chain`, docs/testing.md "State
machines in the simulator"): every node runs the real applier with snapshots and, on the
segment store, retention behind them; after every step each replica's state must be the
state machine applied to the committed history up to its applied index, every result and
read answered to a client must be the reference's, and every snapshot on disk must restore
to the reference state at its index.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.sim import mutations
from tools.sim.world import ALL_FAULTS, SimConfig, Violation, run_seed

# (state machine, store, nodes, seeds): about 25 s in all on a 2-core box
SEED_SETS = [
    ("kv", "memory", 3, range(0, 150)),
    ("kv", "segment", 3, range(1000, 1100)),
    ("chain", "memory", 3, range(2000, 2060)),
    ("chain", "segment", 3, range(3000, 3040)),
    ("kv", "segment", 5, range(4000, 4015)),
]


def _explain(r) -> str:  # noqa: ANN001
    return (f"seed {r.seed} failed after {r.steps} steps / {r.virtual_ms} virtual ms: {r.error}\n"
            f"{r.trace}")


@pytest.mark.parametrize(("sm", "store", "nodes", "seeds"), SEED_SETS,
                         ids=[f"{sm}-{s}-{n}nodes" for sm, s, n, _ in SEED_SETS])
def test_fixed_seeds_keep_every_state_machine_invariant(sm: str, store: str, nodes: int, seeds: range) -> None:
    for seed in seeds:
        r = run_seed(SimConfig(seed=seed, nodes=nodes, store=store, faults=ALL_FAULTS, state_machine=sm))
        assert r.ok, _explain(r)


def test_sessions_and_a_state_machine() -> None:
    """Session resends answered by a new leader carry the original result (its applier sent the
    results while it followed), never a result of another entry."""
    for seed in range(5000, 5040):
        r = run_seed(SimConfig(seed=seed, store="segment", sessions=True, state_machine="kv"))
        assert r.ok, _explain(r)


def test_a_seed_with_a_state_machine_replays_to_the_same_trace() -> None:
    a = run_seed(SimConfig(seed=7, store="segment", hash_trace=True, state_machine="kv"))
    b = run_seed(SimConfig(seed=7, store="segment", hash_trace=True, state_machine="kv"))
    assert a.ok and b.ok
    assert a.trace_hash == b.trace_hash and (a.steps, a.virtual_ms) == (b.steps, b.virtual_ms)


def test_the_checks_see_snapshots_results_and_reads() -> None:
    """The runs exercise what is checked: snapshots verified, results and state machine reads
    compared, appliers restarted from a snapshot, torn snapshot takes cleaned up, retention
    deleting entries behind snapshots (a guard against a check that never runs)."""
    total: dict[str, int] = {}
    for seed in range(1000, 1030):
        r = run_seed(SimConfig(seed=seed, store="segment", state_machine="kv"))
        assert r.ok, _explain(r)
        for k, v in r.stats.items():
            total[k] = total.get(k, 0) + v
    for k in ("snapshots_verified", "results_checked", "query_success"):
        assert total.get(k, 0) > 10, (k, total)
    # Rarer events: a handful per 30 seeds (5 to 13 snapshot requests answered OK in two ranges
    # of 30), so the guard is that they happen at all.
    for k in ("snapshot_requests_ok", "applier_restored_snapshots", "torn_snapshot_takes",
              "retention_deletions"):
        assert total.get(k, 0) > 0, (k, total)


# (mutation, state machine, store, seeds, what the failure says): the first failing seed is
# documented in docs/testing.md; each range leaves room for seed numbers to move.
MUTATIONS = [
    ("applier-skip", "chain", "memory", range(0, 20), "state machine at applied index"),
    ("applier-skip", "kv", "memory", range(0, 20), "state machine at applied index"),
    ("replay-from-snapshot-index", "chain", "memory", range(0, 80), "state machine at applied index"),
    # the KV store's own guard, or the reference check first
    ("replay-from-snapshot-index", "kv", "memory", range(0, 20), "applied after|state machine at applied index"),
    ("snapshot-index-early", "kv", "memory", range(0, 10), "restores to"),
    ("apply-uncommitted", "kv", "memory", range(0, 10), "beyond its committed index"),
    ("results-shifted", "kv", "memory", range(0, 10), "was answered with result"),
    # with installs (retention no longer held back to what every replica committed) a node may
    # also delete entries before anyone saw them committed: the history check says so first
    ("no-compaction-floor", "chain", "segment", range(0, 40), "past the newest snapshot|while the history ends at"),
    ("applier-keeps-deleted", "kv", "segment", range(0, 40), "still maps data file"),
]


@pytest.mark.parametrize(("mutation", "sm", "store", "seeds", "says"), MUTATIONS,
                         ids=[f"{m}-{sm}" for m, sm, *_ in MUTATIONS])
def test_a_broken_applier_is_caught(mutation: str, sm: str, store: str, seeds: range, says: str) -> None:
    with mutations.apply(mutation):
        for seed in seeds:
            r = run_seed(SimConfig(seed=seed, store=store, state_machine=sm))
            if not r.ok:
                assert any(x in r.error for x in says.split("|")), r.error
                return
    pytest.fail(f"{mutation} was not caught in seeds {seeds.start}..{seeds.stop - 1}")


def test_an_applier_that_keeps_deleted_files_mapped_is_caught_and_the_fix_holds() -> None:
    """Found by the simulator: the applier never called `follow_begin`, so it kept the data
    files retention deleted mapped and the disk never got their space back. The first seed
    that fails with the fix reverted passes with it."""
    kw = dict(store="segment", state_machine="kv")
    with mutations.apply("applier-keeps-deleted"):
        failed = next((r for r in (run_seed(SimConfig(seed=s, **kw)) for s in range(40))  # type: ignore[arg-type]
                       if not r.ok), None)
    assert failed is not None, "the reverted fix was not caught in 40 seeds"
    assert "applier: after a loop turn it still maps data file" in failed.error, failed.error
    assert run_seed(SimConfig(seed=failed.seed, **kw)).ok  # type: ignore[arg-type]


def test_a_log_that_begins_after_the_snapshot_stops_the_node_even_when_the_applier_starts_first() -> None:
    """Found while writing the simulator's applier: the applier checked that the log holds the
    entries after its snapshot once, at restore; the roles start together, so when the
    handler had not published the ledger yet the check passed on an empty ledger and the
    applier then retried stale reads for ever instead of stopping the node with its one-line
    reason. Here a node whose retention deleted entries loses its snapshots (a store replaced
    by hand) and restarts with its applier scheduled before its handler."""
    from tools.sim.world import Sim

    sim = Sim(SimConfig(seed=11, store="segment", state_machine="kv", faults=()))
    try:
        n0 = sim.nodes[0]
        for _ in range(40_000):
            sim.step_once()
            if n0.store is not None and n0.store.ledger_begin_index > 0:
                break
        assert n0.store is not None and n0.store.ledger_begin_index > 0, "retention deleted nothing"
        sim.crash_node(n0, torn=False)
        shutil.rmtree(Path(n0.cfg.store_dir) / "snapshots")
        sim.restart_node(n0)
        with pytest.raises(Violation, match="stopped the node .*the log begins at index"):
            sim._run_step(n0.roles["applier"])  # before the handler has opened the store
            for _ in range(2000):
                sim.step_once()
    finally:
        sim.close()
