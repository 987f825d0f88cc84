"""The role zygote: one pre-imported interpreter per node that the role processes are forked from.

Why: every role used to be a fresh `python -m node.roles.<role>` that imported ~0.2 s of CPU
(zmq, the protocol, the store, the config) before doing anything; a 3-node group on two cores
started 15-18 such interpreters at once, and its first leader waited ~1 s of CPU per node for
imports alone (docs/performance.md "Start time"). The zygote imports a role's modules once; a
role is then a fork of it, which costs milliseconds.

Rules that keep this as safe as a fresh interpreter:

* The zygote is itself a fresh interpreter (`python -m node.roles.zygote`, started by the
  supervisor with close_fds), not a fork of the supervisor: it holds no ZeroMQ context, no
  socket but its request socket, no thread, no shared block, no store file, no lock. Only the
  role modules the node ships (PRELOAD) are imported into it, and importing them has no side
  effect; any other module (a test's fake role) is run in the child only, as `-m` would.
* Each role is still its own OS process, a child of the supervisor as before: the zygote
  forks an intermediate process that forks the role and exits, so the kernel hands the role to
  the supervisor (a child subreaper, PR_SET_CHILD_SUBREAPER). The supervisor waits for it,
  signals it and reaps it by PID exactly as it did a Popen child (`ForkedRole`).
* The child closes every inherited descriptor but 0-2, resets the signal handlers a fresh
  interpreter has (SIGTERM and SIGINT stay blocked from before the fork until then, so a stop
  signal sent to the new pid meets those handlers, never the zygote's), waits until it is the
  supervisor's child, writes the role's usual command line over its own (`python -m
  node.roles.elector --config ... --peer n1`, what ps, the tests and the tools read) and runs
  the module as `__main__` (runpy: `python -m` semantics). Its exit status is the module's, as
  with `python -m`: SystemExit's code, 1 and a traceback for an uncaught exception. The global
  `random` state is reseeded at fork by Python itself.

Protocol (the socket the supervisor passes as `--fd`): one JSON line per request,
`{"module": M, "argv": [...], "title": [...], "parent": PID}`, answered by one line holding the
role's pid, or `error: ...`. The zygote exits when the supervisor closes the socket, dies
(PR_SET_PDEATHSIG) or sends SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import importlib
import json
import logging
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

PRELOAD = frozenset({"node.roles.handler", "node.roles.elector", "node.roles.dispatcher",
                     "node.roles.ack_checker", "node.roles.applier"})
"""The role modules imported into the zygote before the first fork of each (import has no side
effect in these; anything else is imported by the forked child only)."""
FIRST_ROLE = "node.roles.handler"
"""Imported at once, before the first request: the supervisor always starts the handler first."""
REPARENT_POLL_S = 0.0005
REPARENT_TRIES = 10_000  # a forked role waits this many polls (5 s idle) to be the supervisor's child
_PR_SET_PDEATHSIG = 1
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""Blocked from before each fork until the forked role has a fresh interpreter's handlers."""


def set_cmdline(args: list[str]) -> bool:
    """Write `args` over this process's command line (/proc/PID/cmdline, what ps shows), in the
    argv area the kernel recorded at exec (arg_start/arg_end of /proc/self/stat), padded with
    NULs. False, and nothing written, when the area is too small or unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
    except (OSError, IndexError, ValueError):
        return False
    data = b"\0".join(os.fsencode(a) for a in args) + b"\0"
    if start <= 0 or len(data) > end - start:
        return False
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    return True


def title_room(titles: list[list[str]]) -> int:
    """Bytes of command line the zygote must be started with so that every title fits."""
    return max((sum(len(os.fsencode(a)) + 1 for a in t) for t in titles), default=0)


def _exit_code(e: SystemExit) -> int:
    """What the interpreter would exit with for this SystemExit."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _run_role(req: dict) -> None:
    """In the forked role process: become the role, run it, exit. Never returns."""
    code = 1
    try:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds
        # The stop signals are blocked (fork_role) while the zygote's handlers are still ours:
        # one that arrives now stays pending in the kernel and, once unblocked, meets a fresh
        # interpreter's handlers (SIGTERM kills, as it would a role started by `python -m`).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        parent = int(req["parent"])
        for _ in range(REPARENT_TRIES):  # the intermediate exits at once; then we are handed over
            if os.getppid() == parent:
                break
            time.sleep(REPARENT_POLL_S)
        else:
            os._exit(1)  # never handed to the supervisor: it is gone, nothing to work for
        set_cmdline(req["title"])
        sys.argv = [req["module"], *req["argv"]]
        # As under `python -m`: the module runs as __main__ only, from its own code (the
        # zygote's imported copy stays out of the way; its imports are what we keep).
        sys.modules.pop(req["module"], None)
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:  # a SIGINT before the role took its own handlers: quietly
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - as `python -m`: a traceback and exit status 1
        traceback.print_exc()
        code = 1
    finally:
        try:
            # The exit path must not be interrupted or print a traceback: a second signal
            # during logging's shutdown, or a handler the role inherited from the zygote whose
            # stream is gone, would otherwise print "Exception ignored in atexit callback".
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            logging.raiseExceptions = False
            atexit._run_exitfuncs()  # what a normal interpreter exit runs (logging's flush...)
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001, S110 - exiting anyway: nothing left to tell it to
            pass
        finally:
            os._exit(code)


def _preload(module: str) -> None:
    """Import a role module into the zygote, once (later forks inherit it), with `crc32c`, which
    the store imports lazily for the push run CRC (node/store/codec.py)."""
    importlib.import_module(module)
    importlib.import_module("crc32c")


def fork_role(req: dict) -> int:
    """Fork the role described by `req` so that it becomes the supervisor's child; its pid."""
    module = req["module"]
    if module in PRELOAD:
        _preload(module)
    r, w = os.pipe()
    # Block the stop signals across the forks. Unblocked, a SIGTERM the supervisor sends the
    # new pid at once (a node told to stop while it starts its roles) could land while the
    # child still has the zygote's handler: between fork() and the interpreter's after-fork
    # reset, which forgets a signal already caught, or between signal.signal's check of
    # pending signals and its change of handler ("Signal 15 ignored due to race condition").
    # Either way the role lived on, deaf to the SIGTERM, until the supervisor killed it.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        mid = os.fork()
        if mid == 0:  # the intermediate: fork the role, say its pid, exit (handing it over)
            try:
                os.close(r)
                pid = os.fork()
                if pid == 0:
                    os.close(w)
                    _run_role(req)
                os.write(w, f"{pid}\n".encode())
            finally:
                os._exit(0)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            line = f.readline()
    finally:
        os.waitpid(mid, 0)
    if not line.strip():
        raise OSError("the intermediate process did not report the role's pid")
    return int(line)


def _on_stop(_signum: int, _frame: object) -> None:
    """Stop at once, quietly: the zygote holds nothing to close (no store file, no ZeroMQ),
    and an exception raised from a signal handler can land in the interpreter's own shutdown
    and print "Exception ignored ... SystemExit" (a Ctrl-C during a group's start-up did)."""
    os._exit(0)


def serve(sock: socket.socket) -> int:
    """Answer the supervisor's requests until it closes the socket."""
    with sock, sock.makefile("rwb", buffering=0) as f:
        for raw in f:
            try:
                reply = str(fork_role(json.loads(raw)))
            except Exception as e:  # noqa: BLE001 - one line back; the supervisor falls back
                reply = f"error: {type(e).__name__}: {e}"
            f.write(reply.encode() + b"\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dledger-zygote")
    ap.add_argument("--fd", type=int, required=True, help="the request socket (from the supervisor)")
    ap.add_argument("--title-room", default="", help="padding: room for the roles' command lines")
    args = ap.parse_args(argv)
    try:  # the supervisor gone: so are we (its roles get the same signal)
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        pass
    signal.signal(signal.SIGTERM, _on_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    try:  # the handler is always the first request: import it while the supervisor makes the block
        _preload(FIRST_ROLE)
    except Exception:  # noqa: BLE001, S110 - its request imports it again and answers the error
        pass
    try:
        return serve(socket.socket(fileno=args.fd))
    except (SystemExit, KeyboardInterrupt, BrokenPipeError, ConnectionResetError):
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
