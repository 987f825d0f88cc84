"""tools/bench/wakeup.py: every kind it reports really wakes the other process.

The benchmark's figures are in docs/performance.md "Doorbells"; these runs are bounded by
counts (a few dozen round trips), so they check that each kind measures a wake-up that
happened (every round trip answered, a positive time), not how fast it is.
"""

from __future__ import annotations

import json

import psutil
import pytest

from tools.bench import wakeup


@pytest.mark.parametrize("kind", wakeup.KINDS)
def test_each_kind_answers_every_round_trip(kind):
    times = wakeup.run_kind(kind, 30)
    assert len(times) == 30 and all(t > 0 for t in times)


@pytest.mark.parametrize("kind", wakeup.FANOUT_KINDS)
def test_a_fan_out_round_waits_for_every_waiter(kind):
    times = wakeup.run_fanout(kind, 30, 2)
    assert len(times) == 30 and all(t > 0 for t in times)


def test_the_command_line_prints_one_json_object_and_stops_its_spinners(capsys):
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    assert wakeup.main(["--count", "20", "--kinds", "pipe,zmq", "--busy", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["round_trip"]) == {"pipe", "zmq"} and out["busy"] == 1
    assert all(r["p50_us"] > 0 for r in out["round_trip"].values())
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    assert left == []  # the spinner and the echo processes were stopped and reaped
