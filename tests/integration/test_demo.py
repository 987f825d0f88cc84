"""`make run` (tools/demo.py) on real processes: it must exit 0 and print measured figures for
the failover, a stamped append resent to the new leader answered with its original index, and
a committed log holding every acknowledged append exactly once; and leave nothing behind."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _blocks_left(root: str) -> list[str]:
    """The demo's own nodes' shared blocks still in /dev/shm, named from their store
    directories (a before/after listing of /dev/shm also counts the blocks of any other group
    on the machine whose nodes were killed meanwhile)."""
    from node.block.shared_state import segment_name

    names = [segment_name("default", f"n{i}", Path(root, f"n{i}")) for i in range(3)]
    return [n for n in names if Path("/dev/shm", n).exists()]


def _processes_mentioning(text: str) -> list[int]:
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if text.encode() in (p / "cmdline").read_bytes():
                out.append(int(p.name))
        except OSError:
            pass
    return out


def _one(pattern: str, out: str) -> re.Match:
    m = re.search(pattern, out)
    assert m, f"no line matching {pattern!r} in:\n{out}"
    return m


def test_demo_measures_failover_and_shows_a_retried_append_stored_once():
    r = subprocess.run([sys.executable, "-m", "tools.demo"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]

    root = _one(r"stores: (\S+)", out).group(1)
    killed = _one(r"SIGKILL the leader (n\d) \(term (\d+),", out)
    fail = _one(r"new leader (n\d) \(term (\d+)\) elected (\d+\.\d+) s after the kill; the writer's "
                r"next acknowledged append came (\d+\.\d+) s after it", out)
    assert fail.group(1) != killed.group(1) and int(fail.group(2)) > int(killed.group(2))
    election, outage = float(fail.group(3)), float(fail.group(4))
    assert 0 < election < 5, election
    assert 0 < outage < 10, outage
    counts = _one(r"\((\d+) appends before the kill, (\d+) after, (\d+) errors\)", out)
    assert int(counts.group(1)) > 0 and int(counts.group(2)) > 0, counts.group(0)

    stamped = _one(r"APPEND (b'once-[0-9a-f]+') stamped \(session (0x[0-9a-f]+), seq 1\)\n"
                   r"  -> index (\d+)", out)
    body, session, index = stamped.groups()
    resent = _one(rf"resending the same stamped APPEND \(session {session}, seq 1\) to the new leader "
                  rf"(n\d) -> index (\d+) \(the same index\)", out)
    assert resent.group(1) == fail.group(1) and resent.group(2) == index
    _one(rf"in the committed log \(indexes 0\.\.\d+\): {re.escape(body)} once, at index {index}\n", out)
    _one(r"every acknowledged append \(\d+: 8 above, [1-9]\d* by the writer\) exactly once at its "
         r"acknowledged index: yes\n", out)

    assert not Path(root).exists(), f"the demo left {root}"
    assert not _processes_mentioning(root), "the demo left a server running"
    assert not _blocks_left(root), "the demo left a node's shared block behind"
