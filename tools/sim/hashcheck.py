"""Record or compare the trace hashes of a fixed set of seeds (a refactoring check).

    python -m tools.sim.hashcheck record FILE    # run the set, write seed -> (hash, ok, steps, virtual ms)
    python -m tools.sim.hashcheck check FILE     # run the set again, exit 1 on any difference

Why: a change to the simulator's structure (modules moved, clocks injected instead of patched)
must leave every seed's history exactly as it was; the trace hash covers every event, so one
moved random draw or a reordered event shows up. The set spans the default faults on both
stores, the session faults, a state machine with installs, membership changes with a joining
machine, and every fault kind at once.
"""

from __future__ import annotations

import json
import os
import sys

from tools.sim.world import ALL_FAULTS, SESSION_FAULTS, SimConfig, run_seed

EXTRA_FAULTS = ("corrupt", "eager-commit", "disk-full", "figure8", "membership", "join")

CASES: list[tuple[str, dict]] = (
    [(f"memory-{s}", dict(seed=s)) for s in range(10)]
    + [(f"segment-{s}", dict(seed=s, store="segment")) for s in range(5)]
    + [(f"sessions-{s}", dict(seed=s, store="segment", sessions=True, faults=ALL_FAULTS + SESSION_FAULTS))
       for s in range(5)]
    + [(f"kv-{s}", dict(seed=s, store="segment", state_machine="kv")) for s in range(3)]
    + [(f"join-{s}", dict(seed=s, steps=2500, faults=ALL_FAULTS + ("membership", "join"))) for s in range(6)]
    + [(f"every-{s}", dict(seed=s, sessions=True, faults=ALL_FAULTS + SESSION_FAULTS + EXTRA_FAULTS))
       for s in range(3)]
)


def run_all() -> dict[str, list]:
    """Every case's (hash, ok, steps, virtual ms)."""
    out = {}
    for name, kw in CASES:
        r = run_seed(SimConfig(hash_trace=True, **kw))
        out[name] = [r.trace_hash, r.ok, r.steps, r.virtual_ms]
        print(name, *out[name], flush=True)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("record", "check"):
        print("usage:\n" + "\n".join(__doc__.strip().splitlines()[2:4]), file=sys.stderr)
        return 2
    if argv[0] == "check":
        try:
            with open(argv[1]) as f:
                want = json.load(f)
        except (OSError, ValueError) as e:
            print(f"hashcheck: cannot read recorded hashes {argv[1]}: {e}", file=sys.stderr)
            return 2
    if os.environ.get("PYTHONHASHSEED") != "0":  # str hashes are salted per process
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tools.sim.hashcheck", *argv])
    got = run_all()
    if argv[0] == "record":
        with open(argv[1], "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
        return 0
    bad = [k for k in want if want[k] != got.get(k)]
    for k in bad:
        print(f"DIFFERS {k}: recorded {want[k]} now {got.get(k)}")
    print(f"{len(want) - len(bad)}/{len(want)} seeds identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
