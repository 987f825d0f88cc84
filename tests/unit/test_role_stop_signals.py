"""A stop signal that reaches a role while it starts is obeyed, never lost (node/roles/zygote.py,
node/roles/runtime.py). A supervisor told to stop sends SIGTERM to a role the moment it has its
pid, so the signal can land at any point of the role's start-up; a role that lost it ran on,
deaf, until the supervisor killed it after stop_grace_ms (and, in one window, Python printed
"Signal 15 ignored due to race condition"). Each test runs the production code in a fresh
interpreter with real signals, and makes the signal land at one exact point of the start-up."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FORK_WITH_SIGTERM_AT_AFTER_FORK = textwrap.dedent("""
    import ctypes, os, signal, sys
    from node.roles import zygote

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the role is handed to us
    me = os.getpid()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(77))  # the zygote's own handler, recognisable

    depth = 0  # forks between us and this process: the intermediate is 1, the role 2

    def sigterm_in_the_role():  # (not by its parent: the role may already be handed to us)
        global depth
        depth += 1
        if depth == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    os.register_at_fork(after_in_child=sigterm_in_the_role)
    pid = zygote.fork_role({"module": "this_module_is_never_run", "argv": [], "title": ["role"],
                            "parent": me})
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
""")


def test_a_sigterm_right_after_the_fork_kills_the_role_as_it_would_a_fresh_interpreter():
    """The signal lands in the forked child at once (an at-fork hook sends it), while the child
    still has the zygote's handler. It must wait until the child has a fresh interpreter's
    handlers and then kill it (-15). Before the fix the zygote's handler ran in the child
    (exit 77 here); in the real zygote that handler, or Python's after-fork reset of caught
    signals, could swallow the SIGTERM."""
    done = subprocess.run([sys.executable, "-c", FORK_WITH_SIGTERM_AT_AFTER_FORK], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "-15", (done.stdout, done.stderr)
    assert "race condition" not in done.stderr and "Traceback" not in done.stderr, done.stderr


ROLE_WITH_SIGTERM_WHILE_ATTACHING = textwrap.dedent("""
    import os, signal, sys
    from node.config import NodeConfig
    from node.roles import runtime

    config = sys.argv[1]

    class Block:  # the shared block, attached while SIGTERM arrives
        @classmethod
        def attach(cls, name, role):
            os.kill(os.getpid(), signal.SIGTERM)
            return cls()

        def repair_seqs(self, role):
            return {}

        def close(self):
            pass

    runtime.SharedState = Block
    seen = []
    rc = runtime.role_main("elector", lambda ctx: seen.append(ctx.should_stop()),
                           ["--config", config])
    print(rc, seen)
""")


def test_a_sigterm_before_the_role_context_exists_is_kept_for_it(tmp_path):
    """The signal arrives after the role took its handlers but before its context exists
    (while it attaches the shared block). Before the fix the handler had no context to tell and
    dropped it: the role then ran its loop as if nothing had been asked."""
    cfg = tmp_path / "run" / "config.json"
    cfg.parent.mkdir()
    from node.config import NodeConfig

    cfg.write_text(NodeConfig(id="n0", peers="n0-127.0.0.1:1", store_dir=str(tmp_path / "s")).to_json())
    done = subprocess.run([sys.executable, "-c", ROLE_WITH_SIGTERM_WHILE_ATTACHING, str(cfg)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0 [True]", (done.stdout, done.stderr)
