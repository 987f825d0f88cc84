"""Datadriven election scenarios (after etcd-raft's interaction tests).

Each file in ``election/`` is a list of blocks::

    # comment
    command args
    ----
    expected output (the trace lines the command produced)
    <blank line>

Commands (see election_sim.Sim): ``add-nodes N [seed=S] [latency=A-B] [drop=P]``,
``run MS``, ``stabilize [max=MS]``, ``status``, ``crash ID``, ``restart ID|all``,
``pause ID MS``, ``partition A B | C D``, ``isolate ID``, ``heal``, ``drop P``,
``latency A-B``, ``append [N]``, ``transfer ID``, ``leader``. An ID argument ``leader`` means
the current agreed leader.
Invariants (one leader per term, one vote per term per node, persist before send) are checked
on every effect by the simulator itself.

Regenerate the expected output after an intended behaviour change with
``DLEDGER_REWRITE=1 .venv/bin/pytest tests/scenarios/test_election_scenarios.py`` and review
the diff: every changed line is a changed protocol decision.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from election_sim import Sim

HERE = Path(__file__).parent / "election"
FILES = sorted(HERE.glob("*.txt"))
REWRITE = os.environ.get("DLEDGER_REWRITE") == "1"


def _parse(text: str) -> list[tuple[list[str], str, list[str]]]:
    """-> [(comment lines, command, expected lines)]"""
    blocks = []
    lines = text.splitlines()
    i = 0
    comments: list[str] = []
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("#"):
            comments.append(line)
            i += 1
            continue
        cmd = line.strip()
        i += 1
        if i >= len(lines) or lines[i].strip() != "----":
            raise ValueError(f"missing ---- after {cmd!r}")
        i += 1
        expected = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i].rstrip())
            i += 1
        blocks.append((comments, cmd, expected))
        comments = []
    return blocks


def _kv(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if "=" in a)


def _range(s: str) -> tuple[int, int]:
    a, b = s.split("-")
    return int(a), int(b)


class Runner:
    def __init__(self) -> None:
        self.sim: Sim | None = None

    def run(self, cmd: str) -> list[str]:
        name, *args = cmd.split()
        if name == "add-nodes":
            kv = _kv(args)
            self.sim = Sim(int(args[0]), seed=int(kv.get("seed", 0)),
                           latency=_range(kv.get("latency", "1-10")),
                           drop=float(kv.get("drop", 0)))
            start = len(self.sim.trace)
            return self.sim.trace[start:] + self.sim.status()
        sim = self.sim
        assert sim is not None, "add-nodes first"
        start = len(sim.trace)
        extra: list[str] = []
        # "leader" as a node argument means the current agreed leader.
        args = [(sim.leader() or "-") if a == "leader" and name != "add-nodes" else a
                for a in args]
        if name == "run":
            sim.run(int(args[0]))
        elif name == "stabilize":
            took = sim.stabilize(int(_kv(args).get("max", 10_000)))
            lead = sim.leader()
            extra.append(f"leader {lead} term={sim.nodes[lead].core.term} after {took}ms"
                         if lead else "no leader")
        elif name == "status":
            extra = sim.status()
        elif name == "leader":
            extra.append(f"leader {sim.leader() or '-'}")
        elif name == "crash":
            sim.crash(args[0])
        elif name == "restart":
            for nid in (sim.ids if args[0] == "all" else args[:1]):
                sim.restart(nid)
        elif name == "pause":
            sim.pause(args[0], int(args[1]))
        elif name == "partition":
            groups, cur = [], []
            for a in args:
                if a == "|":
                    groups.append(cur)
                    cur = []
                else:
                    cur.append(a)
            groups.append(cur)
            sim.partition(*groups)
        elif name == "isolate":
            sim.isolate(args[0])
        elif name == "heal":
            sim.heal()
        elif name == "drop":
            sim.drop = float(args[0])
        elif name == "latency":
            sim.latency = _range(args[0])
        elif name == "append":
            lead = sim.append(int(args[0]) if args else 1)
            extra.append(f"appended on {lead}" if lead else "no leader to append on")
        elif name == "transfer":
            sim.take_leadership(args[0])
        else:
            raise ValueError(f"unknown command {name!r}")
        return sim.trace[start:] + extra


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_scenario(path: Path) -> None:
    blocks = _parse(path.read_text())
    runner = Runner()
    out_text = []
    mismatches = []
    for comments, cmd, expected in blocks:
        got = runner.run(cmd)
        if got != expected:
            mismatches.append(f"{cmd}\n  expected:\n    " + "\n    ".join(expected)
                              + "\n  got:\n    " + "\n    ".join(got))
        out_text += comments + [cmd, "----", *got, ""]
    if REWRITE:
        path.write_text("\n".join(out_text))
        return
    assert not mismatches, f"{path.name}:\n" + "\n".join(mismatches)


def test_there_are_scenarios() -> None:
    assert len(FILES) >= 6
