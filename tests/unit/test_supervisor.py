"""The supervisor never leaves a half-alive node: a role that stops fatally (RoleContext.fatal)
or crash-loops stops the whole node with one line, `dledger server: error: <role>: <reason>`,
and exit status 1 (docs/contracts.md C6)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import deque
from pathlib import Path

from node.block.shared_state import segment_name
from node.roles.runtime import fatal_file
from node.roles.supervisor import (
    CRASH_LOOP_RESTARTS,
    CRASH_LOOP_WINDOW_MS,
    crash_loop,
    fatal_reason,
)
from node.wiring.ports import free_port_pairs

REPO = Path(__file__).resolve().parents[2]


def test_crash_loop_counts_restarts_within_the_window_only():
    recent: deque[int] = deque()
    t = 1_000_000
    for i in range(CRASH_LOOP_RESTARTS):
        assert not crash_loop(recent, t + i * 100)
        recent.append(t + i * 100)
    assert crash_loop(recent, t + CRASH_LOOP_RESTARTS * 100)
    # the same restarts spread over more than the window are no loop
    later = t + CRASH_LOOP_WINDOW_MS + 150
    assert not crash_loop(recent, later) and len(recent) == CRASH_LOOP_RESTARTS - 2


def test_fatal_reason_is_the_roles_own_line_or_the_exit_status(tmp_path):
    assert fatal_reason(tmp_path, "elector", "exit 3") == "stopped fatally (exit 3)"
    fatal_file(tmp_path, "dispatcher[2]").write_text("/x/currterm: bad\nsecond\n")
    assert fatal_reason(tmp_path, "dispatcher[2]", "exit 3") == "/x/currterm: bad second"
    assert fatal_reason(None, "elector", "signal 9") == "stopped fatally (signal 9)"


# ---- real processes: a supervisor whose only role is a fake module --------------------------

ROLES = {
    # exits 1 at once, every time: a crash loop
    "crasher_role": "import sys\nsys.exit(1)\n",
    # the real role start-up, then a fatal stop through the RoleContext
    "fatal_role": textwrap.dedent("""
        from node.roles.runtime import role_main
        raise SystemExit(role_main("handler", lambda rc: rc.fatal("/data/n0/some-file: broken\\nbadly")))
    """),
    # the real role start-up, then its doorbell where a plain file took the name
    "bell_role": textwrap.dedent("""
        from node.roles.runtime import role_main
        from node.wiring import channels

        def run(rc):
            (rc.run_dir / channels.COMMIT_BELL.file_name()).write_text("in the way")
            rc.bell(channels.COMMIT_BELL)

        raise SystemExit(role_main("handler", run))
    """),
}

SUPERVISOR = """
import logging
import sys
from node.config import NodeConfig
from node.roles import supervisor as S

module, store, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
cfg = NodeConfig(id="n0", peers=f"n0-127.0.0.1:{port}", store_dir=store)
S.Supervisor._plan_roles = lambda self: self.roles.append(S.RoleProc("fake", module, "handler"))
sys.exit(S.Supervisor(cfg).run())
"""


def _run_supervisor(tmp_path: Path, module: str) -> tuple[subprocess.CompletedProcess, float]:
    mods = tmp_path / "mods"
    mods.mkdir()
    for name, code in ROLES.items():
        (mods / f"{name}.py").write_text(code)
    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(mods)])}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SUPERVISOR, module, str(store),
                           str(free_port_pairs(1)[0])], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert not Path("/dev/shm", segment_name("default", "n0", str(store))).exists()
    return done, time.monotonic() - t0


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("dledger server: error:")]


def test_a_crash_looping_role_stops_the_node_with_one_line(tmp_path):
    done, took = _run_supervisor(tmp_path, "crasher_role")
    assert done.returncode == 1, done.stderr
    (line,) = _error_lines(done.stderr)
    assert line == (f"dledger server: error: fake: crash loop, {CRASH_LOOP_RESTARTS + 1} exits "
                    f"within {CRASH_LOOP_WINDOW_MS // 1000} s (last: exit 1)")
    assert took < CRASH_LOOP_WINDOW_MS / 1000  # backoff 0.1+0.2+0.4+0.8+1.6 s, not for ever


def test_a_fatal_role_stops_the_node_with_its_reason(tmp_path):
    done, took = _run_supervisor(tmp_path, "fatal_role")
    assert done.returncode == 1, done.stderr
    (line,) = _error_lines(done.stderr)
    assert line == "dledger server: error: fake: /data/n0/some-file: broken badly"
    assert "Traceback" not in done.stderr
    # the role's own last log line says it too, at ERROR
    assert "ERROR n0 handler" in done.stderr and "some-file: broken badly" in done.stderr
    assert took < 15
    assert done.stderr.count("started fake") == 1, done.stderr  # never restarted


def test_a_doorbell_that_cannot_be_opened_stops_the_node_with_one_line(tmp_path):
    """A run directory where the named pipe cannot be made would fail every restart the same
    way: the node stops and says why, no traceback, no crash loop."""
    done, took = _run_supervisor(tmp_path, "bell_role")
    assert done.returncode == 1, done.stderr
    (line,) = _error_lines(done.stderr)
    assert line.startswith("dledger server: error: fake: cannot open the doorbell commit.bell in the run directory ")
    assert line.endswith(": not a named pipe (a doorbell)"), line
    assert "Traceback" not in done.stderr
    assert done.stderr.count("started fake") == 1, done.stderr


def test_a_retiring_dispatcher_that_ignores_sigterm_is_killed_after_the_grace_then_its_slot_freed(tmp_path):
    """A member's removal committed: its dispatcher is asked to stop (SIGTERM). One that
    ignores it is SIGKILLed once stop_grace_ms passed, and the slot is released once it is
    reaped: a wedged process never holds a slot (and a peer record) for good."""
    from types import SimpleNamespace

    from node.core.membership import Change, ChangeKind, apply_change, bootstrap_configuration
    from node.core.slots import assign, bootstrap_slots
    from node.roles import supervisor as S
    from node.wiring.slot_file import SlotFile

    peers = {"n0": ("127.0.0.1", 20000), "n1": ("127.0.0.1", 20002), "n2": ("127.0.0.1", 20004)}
    slots = SlotFile(tmp_path)
    slots.update(lambda _: assign(bootstrap_slots(peers),
                                  apply_change(bootstrap_configuration(peers), Change(ChangeKind.REMOVE, "n2"), 5)))
    resets: list[int] = []
    sup = object.__new__(S.Supervisor)
    sup.node, sup.slots, sup._stages = "n0", slots, []
    sup.cfg = SimpleNamespace(stop_grace_ms=300)
    sup.state = SimpleNamespace(read_ledger=lambda: SimpleNamespace(committed_index=9),
                                read_member=lambda: SimpleNamespace(leader_slot=0), reset_peer=resets.append)
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout.readline() == "ready\n"
        owner = slots.table.owners[2]
        keep = S.RoleProc("dispatcher-n1", "node.roles.dispatcher", "dispatcher[1]", slot=1,
                          owner=slots.table.owners[1], proc=SimpleNamespace(poll=lambda: None))
        sup.roles = [keep, S.RoleProc("dispatcher-n2", "node.roles.dispatcher", "dispatcher[2]", slot=2,
                                      owner=owner, proc=stubborn)]
        sup._follow_slots()
        assert sup.roles[1].retiring and stubborn.poll() is None  # asked, ignored
        deadline = time.monotonic() + 10
        while slots.refresh().owners[2] is not None:
            assert time.monotonic() < deadline, "the stubborn dispatcher's slot was never freed"
            sup._follow_slots()
            time.sleep(0.02)
        assert stubborn.returncode == -9 and resets == [2] and sup.roles == [keep]
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
        stubborn.wait()


SIGTERM_WHILE_THE_BLOCK_IS_MADE = """
import os, signal, sys
from node.block import shared_state
from node.config import NodeConfig
from node.roles import supervisor as S

store, port = sys.argv[1], int(sys.argv[2])
real = shared_state.resource_tracker.register

def register(name, rtype):  # the block exists, its tracker does not know it yet: SIGTERM lands
    os.kill(os.getpid(), signal.SIGTERM)
    real(name, rtype)

shared_state.resource_tracker.register = register
sys.exit(S.Supervisor(NodeConfig(id="n0", peers=f"n0-127.0.0.1:{port}", store_dir=store)).run())
"""


def test_a_sigterm_while_the_block_is_made_stops_the_node_and_removes_the_block(tmp_path):
    """A launcher killed at once (its servers get SIGTERM as the parent-death signal) can hit a
    supervisor between creating its block and telling its resource tracker about it. Before its
    handlers were installed first, SIGTERM killed it there and the block stayed in /dev/shm (a
    suite at twice the load caught it: test_a_killed_bench_does_not_leave_its_local_group_running)."""
    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_THE_BLOCK_IS_MADE, str(store),
                           str(free_port_pairs(1)[0])], cwd=REPO, capture_output=True, text=True, timeout=60)
    block = Path("/dev/shm", segment_name("default", "n0", str(store)))
    leaked = block.exists()
    if leaked:
        block.unlink()
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert not leaked, "the block outlived the supervisor"
    assert "started handler" not in done.stderr  # told to stop before it started anything
