"""The supervisor: one per node. Owns the config, the shared state block and the role processes.

circus-style rules: the signal handlers only record what happened (the loop acts on it); a dead
role is noticed through SIGCHLD (the loop wakes on a self-pipe, so "within a second" is really
"at once") and restarted with a capped exponential backoff, its term/vote/store surviving on
disk and in the block; a role that hangs (no beat for `HANG_MS`) is killed and restarted;
stopping is SIGTERM → grace → SIGKILL, by PID; the block is unlinked and exit is 0.

Roles are forked from a pre-imported zygote (node/roles/zygote.py: one fresh interpreter per
node that imported the role modules, so a role's start costs milliseconds instead of ~0.2 s of
imports) and handed to the supervisor by the kernel (it is a child subreaper), so each is still
its own OS process, our child, with its usual command line. If the zygote cannot be used (it
died, it did not answer, no PR_SET_CHILD_SUBREAPER, or DLEDGER_NO_ZYGOTE=1 in the environment)
the roles are started as fresh interpreters, as before.

Never a half-alive node that answers but cannot elect or replicate: a role that exits with
`EXIT_FATAL` (RoleContext.fatal: a damaged term file, a corrupt store, a store it cannot write)
or that crash-loops (`CRASH_LOOP_RESTARTS` restarts within `CRASH_LOOP_WINDOW_MS`) stops the
whole node, which prints one line, `dledger server: error: <role>: <reason>` (the role's fatal
reason, or its last exit status), and exits 1.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from node.block.shared_state import SharedState, monotonic_ms, stop_resource_tracker
from node.config import NodeConfig
from node.core.slots import SlotOwner, SlotTable, bootstrap_slots, plan_dispatchers, release
from node.host.interpreter import child_env, module_command
from node.host.rundirs import make_owned_tempdir
from node.host.rundirs import release as release_run_dir
from node.roles.names import EXIT_FATAL, fatal_file, state_name
from node.roles.zygote import title_room
from node.wiring.slot_file import SlotFile, SlotFileError

HANG_MS = 10_000
STAGE_MAX_MS = 5_000
"""At start the roles are spawned in stages (handler, elector, the rest), each once the one
before has beaten, or after this long at most."""
STARTUP_POLL_MS = 10  # how often the loop looks for that first beat
SLOT_POLL_MS = 200
"""How often the loop looks at the slot table and the committed index (a `stat` and one block
read): a member added is given its dispatcher within this, a removed one stops within it."""
MIN_BACKOFF_MS = 100
STABLE_MS = 10_000  # a role up this long gets its backoff reset
CRASH_LOOP_RESTARTS = 5  # restarts within CRASH_LOOP_WINDOW_MS that make a crash loop
CRASH_LOOP_WINDOW_MS = 30_000
ZYGOTE_REPLY_S = 30.0
"""How long a fork request may take (the zygote imports a role's modules on its first fork):
past it the zygote is stopped and the roles start as fresh interpreters."""
NO_ZYGOTE_ENV = "DLEDGER_NO_ZYGOTE"  # "1": start every role as a fresh interpreter
_PR_SET_CHILD_SUBREAPER = 36

log = logging.getLogger("dledger.supervisor")


class SupervisorError(RuntimeError):
    pass


@dataclass
class RoleProc:
    name: str  # "elector", "handler", "ack_checker", "dispatcher-n1"
    module: str
    beat_role: str  # the block's writer name: "dispatcher[1]"
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | ForkedRole | None = None
    started_ms: int = 0
    backoff_ms: int = MIN_BACKOFF_MS
    restart_at_ms: int | None = None
    restarts: int = 0
    slot: int | None = None  # a dispatcher's peer slot
    owner: SlotOwner | None = None  # a dispatcher's follower, as the slot table named it
    retiring: bool = False  # a dispatcher stopped for good: its slot is released once it exited
    retire_kill_at_ms: int = 0  # when a retiring one that ignored SIGTERM is killed (stop_grace_ms)
    recent_restarts: deque[int] = field(default_factory=deque)  # when, within the window


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ForkedRole:
    """A role forked by the zygote and handed to us by the kernel: the part of Popen's interface
    the supervisor uses (pid, poll, wait, send_signal, kill, returncode), over waitpid/kill.
    It is our child from the moment we learn its pid (the zygote answers only once the
    intermediate process that forked it has exited), so waitpid reaps it as Popen would."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours (cannot happen: see the class docstring)
                self.returncode = 1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            while self.poll() is None:
                try:
                    _, status = os.waitpid(self.pid, 0)
                    self.returncode = os.waitstatus_to_exitcode(status)
                except ChildProcessError:
                    self.returncode = 1
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def crash_loop(recent_restarts: deque[int], now_ms: int) -> bool:
    """Forget restarts older than the window; True when the window already holds
    CRASH_LOOP_RESTARTS of them (so this death would be one restart too many)."""
    while recent_restarts and now_ms - recent_restarts[0] > CRASH_LOOP_WINDOW_MS:
        recent_restarts.popleft()
    return len(recent_restarts) >= CRASH_LOOP_RESTARTS


def fatal_reason(run_dir: Path | None, beat_role: str, how: str) -> str:
    """What a role that exited EXIT_FATAL said (RoleContext.fatal), or its exit status."""
    if run_dir is not None:
        try:
            text = fatal_file(run_dir, beat_role).read_text(encoding="utf-8", errors="replace")
            line = " ".join(text.splitlines()).strip()
            if line:
                return line
        except OSError:
            pass
    return f"stopped fatally ({how})"


class Supervisor:
    def __init__(self, cfg: NodeConfig, debug: bool = False) -> None:
        self.cfg = cfg
        self.debug = debug
        self.node = cfg.id
        self.store_dir = Path(cfg.store_dir).resolve()
        self.roles: list[RoleProc] = []
        self.state: SharedState | None = None
        self.run_dir: Path | None = None
        self._own_run_dir = False
        self._run_dir_fd: int | None = None
        self._lock_fd: int | None = None
        self._stop_requested = False
        self._child_exited = False
        self._fatal: str | None = None
        self._wake_r, self._wake_w = -1, -1
        self._metrics = None  # node.observe.metrics.MetricsServer when --metrics-port is set
        self._stages: list[list[RoleProc]] = []  # roles still to start, stage by stage
        self._waiting_on: list[RoleProc] = []  # the stage started last
        self._stage_deadline = 0
        self._zygote: subprocess.Popen | None = None
        self._zsock: socket.socket | None = None
        self._subreaper = False  # PR_SET_CHILD_SUBREAPER set: orphans of our roles come to us
        self.slots: SlotFile | None = None  # the node's peer slot table (node.wiring.slot_file)

    # ------------------------------------------------------------------ set-up
    def _lock_store(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.store_dir / "node.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise SupervisorError(f"store dir {self.store_dir} is in use by another node (pid {other or '?'})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _check_ports(self) -> None:
        """Refuse to start, in one line, when this node's data or elector port is taken.

        The roles bind these themselves and a role that fails is restarted, which heals a
        port freed a moment later; but a port held for good (another program, a wrong
        `--peers`) would otherwise show up only as a role crashing forever in the log.
        SO_REUSEADDR as ZeroMQ's listeners set it, so a port whose old connections sit in
        TIME_WAIT counts as free, exactly as it is for the roles."""
        host, port = self.cfg.address
        for what, p in (("data", port), ("elector", port + 1)):
            try:
                family, kind, proto, _, addr = socket.getaddrinfo(host, p, type=socket.SOCK_STREAM)[0]
                with socket.socket(family, kind, proto) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(addr)
            except OSError as e:
                raise SupervisorError(f"cannot listen on {host}:{p} ({what} port): "
                                      f"{e.strerror or e}") from None

    def _start_metrics(self) -> None:
        """`--metrics-port`: serve the node's metrics from here (node/observe/metrics.py), bound before
        any role starts so a taken port is one line and exit 1, not a node half up."""
        if not self.cfg.metrics_port:
            return
        from node.observe.metrics import MetricsServer, NodeCollector
        from node.observe.status import software_version

        host = self.cfg.address[0]
        collector = NodeCollector(lambda: self.state, self.cfg.group, self.node, self.cfg.peer_ids,
                                  str(self.store_dir), software_version(),
                                  lambda: {r.name: r.restarts for r in self.roles},
                                  self._slot_ids)
        try:
            self._metrics = MetricsServer(host, self.cfg.metrics_port, collector)
        except OSError as e:
            raise SupervisorError(f"cannot listen on {host}:{self.cfg.metrics_port} (metrics port): "
                                  f"{e.strerror or e}") from None

    def _make_run_dir(self) -> None:
        if self.cfg.run_dir:
            self.run_dir = Path(self.cfg.run_dir)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:  # short: ipc:// socket paths must stay under ~100 bytes. Owned (node.host.rundirs):
            # the run dirs of nodes that were SIGKILLed are reclaimed here, not left in /tmp.
            self.run_dir, self._run_dir_fd = make_owned_tempdir(
                f"dl-{self.node}-", "/tmp", sweep_prefix="dl-", legacy_run_dirs=True)
            self._own_run_dir = True
        cfg = json.loads(self.cfg.to_json())
        cfg["store_dir"] = str(self.store_dir)
        cfg["run_dir"] = str(self.run_dir)
        (self.run_dir / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
        # Where embedding code finds this node's role channel (node.wiring.listeners); removed at stop.
        info = {"pid": os.getpid(), "run_dir": str(self.run_dir), "id": self.node, "group": self.cfg.group}
        tmp = self.store_dir / "run.json.tmp"
        tmp.write_text(json.dumps(info), encoding="utf-8")
        os.replace(tmp, self.store_dir / "run.json")

    def _plan_roles(self) -> None:
        """Every role that exists in this build: start what exists, fake nothing. The
        dispatchers are those of the slot table, which starts as the `--peers` positions
        (written here, before any role reads it: node.wiring.slot_file)."""
        plan = [("handler", "node.roles.handler", "handler", []),
                ("elector", "node.roles.elector", "elector", []),
                ("ack_checker", "node.roles.ack_checker", "ack_checker", [])]
        if self.cfg.state_machine:
            plan.append(("applier", "node.roles.applier", "applier", []))
        for name, module, beat_role, args in plan:
            if importlib.util.find_spec(module) is not None:
                self.roles.append(RoleProc(name, module, beat_role, args))
        assert self.run_dir is not None
        self.slots = SlotFile(self.run_dir)
        try:
            table = self.slots.update(lambda _: bootstrap_slots(self.cfg.peer_map))
        except SlotFileError as e:
            raise SupervisorError(str(e)) from None
        for slot, owner in table.held():
            if owner.id != self.node:
                self.roles.append(self._dispatcher(slot, owner))

    def _dispatcher(self, slot: int, owner: SlotOwner) -> RoleProc:
        return RoleProc(f"dispatcher-{owner.id}", "node.roles.dispatcher", f"dispatcher[{slot}]",
                        ["--peer", owner.id, "--slot", str(slot), "--address", f"{owner.host}:{owner.port}"],
                        slot=slot, owner=owner)

    def _slot_ids(self) -> list[str]:
        """The member id of every peer slot ("" for a free one), for the metrics' labels."""
        t = self.slots.table if self.slots is not None else None
        if t is None:
            return list(self.cfg.peer_ids)
        return [t.id_of(i) for i in range(len(t.owners))]

    # ------------------------------------------------------------------ membership
    def _follow_slots(self) -> None:
        """Keep one dispatcher per held slot (docs/membership.md "Processes"): start one for a
        member the handler gave a slot, and stop the one of a leaving member once its removal
        committed, then release its slot (record reset first: the next owner never inherits a
        watermark). The node keeps running throughout: nothing else restarts."""
        if self.slots is None or self.state is None:
            return  # no table (a plan without dispatchers)
        try:
            table = self.slots.refresh()
        except SlotFileError as e:
            log.error("%s %s", self.node, e)
            return
        if table is None:
            return
        serving = {r.slot: (r.owner.id, r.owner.host, r.owner.port) for r in self.roles
                   if r.slot is not None and r.owner is not None and not r.retiring}
        running = {r.slot for r in self.roles if r.slot is not None and r.proc is not None and r.proc.poll() is None}
        committed = self.state.read_ledger().committed_index
        plan = plan_dispatchers(table, self.node, committed, self.state.read_member().leader_slot,
                                serving, running)
        for slot in plan.start:
            owner = table.owners[slot]
            assert owner is not None
            for r in [r for r in self.roles if r.slot == slot]:  # exited: an earlier owner's, or
                self.roles.remove(r)                            # this one's, stopped and taken back
            r = self._dispatcher(slot, owner)
            self.roles.append(r)
            log.info("%s member %s (%s:%d) holds slot %d: starting its dispatcher", self.node,
                     owner.id, owner.host, owner.port, slot)
            if self._stages:
                self._stages[-1].append(r)  # started with the other dispatchers
            else:
                self._spawn(r)
        for slot in plan.free_guests:
            self._release(slot, table.owners[slot])
        for slot in plan.retire:
            owner = table.owners[slot]
            mine = [r for r in self.roles if r.slot == slot]
            now = monotonic_ms()
            for r in mine:
                if not r.retiring:
                    r.retiring = True
                    r.retire_kill_at_ms = now + self.cfg.stop_grace_ms
                    log.info("%s member %s left (removal committed at %d): stopping its dispatcher",
                             self.node, owner.id if owner else "?", committed)
                    if r.proc is not None and r.proc.poll() is None:
                        r.proc.send_signal(signal.SIGTERM)
                elif r.proc is not None and r.proc.poll() is None and now >= r.retire_kill_at_ms:
                    log.warning("%s %s pid=%d ignored SIGTERM for %d ms; killing", self.node, r.name,
                                r.proc.pid, self.cfg.stop_grace_ms)
                    r.proc.kill()  # the slot is released on a later pass, once it is reaped
            if all(r.proc is None or r.proc.poll() is not None for r in mine):
                self._release(slot, owner)

    def _release(self, slot: int, owner: SlotOwner | None) -> None:
        """The slot's dispatcher exited: reset its record, then free it in the table, unless the
        member came back meanwhile (re-checked under the table's lock)."""
        assert self.slots is not None and self.state is not None

        def free(t: SlotTable | None) -> SlotTable:
            assert t is not None
            o = t.owners[slot]
            if o is None or o != owner or not (o.leaving or o.guest):
                return t  # taken back (re-added at its address) or already released
            self.state.reset_peer(slot)  # under the lock: no owner can be assigned meanwhile
            return release(t, slot)

        try:
            table = self.slots.update(free)
        except SlotFileError as e:
            log.error("%s %s", self.node, e)
            return
        if table.owners[slot] is None:
            for r in [r for r in self.roles if r.slot == slot and r.retiring]:
                self.roles.remove(r)  # exited (the caller checked)
            log.info("%s slot %d released (was %s)", self.node, slot, owner.id if owner else "?")
        # else: its member came back; the next pass starts a dispatcher for it (the exited
        # retiring one is dropped there)

    # ------------------------------------------------------------------ processes
    def _role_cmd(self, r: RoleProc) -> list[str]:
        """The role's command line: what it is started with as a fresh interpreter, and the
        title a forked one takes (ps, the tools and the tests read it)."""
        assert self.run_dir is not None
        cmd = [sys.executable, "-m", r.module, "--config", str(self.run_dir / "config.json"), *r.args]
        if self.debug:
            cmd.append("--debug")
        return cmd

    def _start_zygote(self) -> None:
        """Start the node's zygote (module docstring), unless it is turned off or the kernel
        cannot hand its forks to us. Nothing is waited for: it imports on its first request."""
        if os.environ.get(NO_ZYGOTE_ENV) == "1":
            return
        try:
            if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                return
        except (OSError, AttributeError):  # pragma: no cover - non-Linux
            return
        self._subreaper = True
        ours, theirs = socket.socketpair()
        base = module_command("node.roles.zygote", "--fd", str(theirs.fileno()), "--title-room")
        room = title_room([self._role_cmd(r) for r in self.roles]) - title_room([base]) + 64
        try:
            # SIGINT ignored from exec on (an ignored signal stays ignored through exec): a
            # Ctrl-C while the zygote imports would print a KeyboardInterrupt traceback; the
            # supervisor stops it (SIGTERM, or the parent-death signal) and it ignores Ctrl-C.
            self._zygote = subprocess.Popen([*base, "." * max(1, room)], stdin=subprocess.DEVNULL,
                                            close_fds=True, pass_fds=(theirs.fileno(),), env=child_env(),
                                            preexec_fn=_ignore_sigint)
        except OSError as e:
            log.warning("%s cannot start the zygote (%s): roles start as fresh interpreters",
                        self.node, e)
            ours.close()
            return
        finally:
            theirs.close()
        ours.settimeout(ZYGOTE_REPLY_S)
        self._zsock = ours

    def _stop_zygote(self) -> None:
        if self._zsock is not None:
            self._zsock.close()  # the zygote exits when its socket closes
            self._zsock = None
        if self._zygote is not None:
            if self._zygote.poll() is None:
                self._zygote.terminate()
            try:
                self._zygote.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait()
            self._zygote = None

    def _fork(self, r: RoleProc, cmd: list[str]) -> ForkedRole | None:
        """Ask the zygote for the role; None (and the zygote stopped for good) if it fails."""
        if self._zsock is None:
            return None
        req = {"module": r.module, "argv": cmd[3:], "title": cmd, "parent": os.getpid()}
        try:
            self._zsock.sendall(json.dumps(req).encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                got = self._zsock.recv(256)
                if not got:
                    raise OSError("the zygote exited")
                reply += got
            text = reply.decode(errors="replace").strip()
            if not text.isdigit():
                raise OSError(text)
            return ForkedRole(int(text))
        except OSError as e:  # socket.timeout is an OSError
            log.warning("%s zygote failed (%s); roles start as fresh interpreters from now on",
                        self.node, e or type(e).__name__)
            self._stop_zygote()
            return None

    def _spawn(self, r: RoleProc) -> None:
        assert self.run_dir is not None
        cmd = self._role_cmd(r)
        fatal_file(self.run_dir, r.beat_role).unlink(missing_ok=True)  # a previous run's reason
        r.proc = self._fork(r, cmd) or subprocess.Popen([cmd[0], "-P", *cmd[1:]], stdin=subprocess.DEVNULL,
                                                        close_fds=True, env=child_env())
        r.started_ms = monotonic_ms()
        r.restart_at_ms = None
        log.info("%s started %s pid=%d%s", self.node, r.name, r.proc.pid,
                 " (forked)" if isinstance(r.proc, ForkedRole) else "")

    def _spawn_handler_first(self) -> None:
        """Start the roles in stages: the handler now, the elector once the handler serves,
        every other role once the elector runs (`_next_stage`; each stage after at most
        STAGE_MAX_MS even if the one before has not beaten yet).

        With the zygote (module docstring) the handler and the elector start together (a fork
        costs milliseconds; the elector waits for the handler's first beat itself), the rest
        once the elector runs.

        Why: the handler alone decides when the node answers (it recovers the store, then binds
        the data port), and the elector when it votes (never before the handler's first beat).
        Six interpreters importing at once on two cores made each start take ~3 s; in stages
        the handler, then the elector, get the cores to themselves, and the dispatchers and
        ack checker (needed only once this node leads) start last."""
        handler = [r for r in self.roles if r.name == "handler"]
        elector = [r for r in self.roles if r.name == "elector"]
        rest = [r for r in self.roles if r not in handler and r not in elector]
        if self._zsock is not None:
            # Forked roles cost milliseconds, not an interpreter's imports: the elector starts
            # with the handler and waits for its first beat itself, so it is ready to vote the
            # moment the handler serves.
            handler, elector = handler + elector, []
        self._stages = [s for s in (elector, rest) if s]
        self._waiting_on = handler
        for r in handler:
            self._spawn(r)
        self._stage_deadline = monotonic_ms() + STAGE_MAX_MS
        if not handler:
            self._next_stage()

    def _stage_ready(self) -> bool:
        """Every role of the last stage started has beaten since it was (re)started."""
        if self.state is None:
            return True
        return all(r.started_ms > 0 and self.state.last_beat(r.beat_role) >= r.started_ms
                   for r in self._waiting_on)

    def _next_stage(self) -> None:
        stage = self._stages.pop(0) if self._stages else []
        for r in stage:
            if r.proc is None and r.restart_at_ms is None:
                self._spawn(r)
        self._waiting_on = stage
        self._stage_deadline = monotonic_ms() + STAGE_MAX_MS

    def _reap_orphans(self) -> None:
        """As the child subreaper (for the zygote's forks) we also inherit whatever a dying role
        leaves running (an on_role_change command of the elector...): reap those once they
        exit, or each stays a zombie for the node's life. Only children that are not a role or
        the zygote: those are reaped through their own objects (poll), which run first, so a
        known zombie here is one that exited since; it is left for the next pass."""
        known = {r.proc.pid for r in self.roles if r.proc is not None}
        if self._zygote is not None:
            known.add(self._zygote.pid)
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in known:
                return
            try:
                os.waitpid(info.si_pid, 0)
            except ChildProcessError:
                return

    def _reap(self) -> None:
        now = monotonic_ms()
        if self._subreaper:
            self._reap_orphans()
        if self._zygote is not None and self._zygote.poll() is not None and not self._stop_requested:
            log.warning("%s zygote pid=%d exited (%s); roles start as fresh interpreters from now on",
                        self.node, self._zygote.pid, self._zygote.returncode)
            self._stop_zygote()
        for r in self.roles:
            if r.proc is None or r.proc.poll() is None:
                continue
            rc = r.proc.returncode
            how = f"signal {-rc}" if rc < 0 else f"exit {rc}"
            if self._stop_requested or r.retiring:
                continue  # a retiring dispatcher: _follow_slots releases its slot
            if rc == EXIT_FATAL:
                self._fatal = f"{r.name}: {fatal_reason(self.run_dir, r.beat_role, how)}"
                log.error("%s %s; stopping the node", self.node, self._fatal)
                return
            if crash_loop(r.recent_restarts, now):
                self._fatal = (f"{r.name}: crash loop, {len(r.recent_restarts) + 1} exits within "
                               f"{CRASH_LOOP_WINDOW_MS // 1000} s (last: {how})")
                log.error("%s %s; stopping the node", self.node, self._fatal)
                return
            r.recent_restarts.append(now)
            if now - r.started_ms >= STABLE_MS:
                r.backoff_ms = MIN_BACKOFF_MS
            log.warning("%s %s pid=%d died (%s); restarting in %d ms", self.node, r.name, r.proc.pid,
                        how, r.backoff_ms)
            r.proc = None
            r.restart_at_ms = now + r.backoff_ms
            r.backoff_ms = min(r.backoff_ms * 2, self.cfg.role_restart_max_backoff_ms)
            r.restarts += 1

    def _watchdog(self, now: int, loop_gap_ms: int) -> None:
        """Kill a role whose beat is stale. Skipped right after the supervisor itself was not
        running (SIGSTOP of the whole node, a suspended VM): everyone's beats are stale then."""
        if self.state is None or loop_gap_ms > 1000:
            return
        for r in self.roles:
            if r.proc is None or r.proc.poll() is not None or now - r.started_ms < HANG_MS:
                continue
            try:
                beat = self.state.last_beat(r.beat_role)
            except (KeyError, ValueError):
                continue
            if beat and now - beat > HANG_MS:
                log.warning("%s %s pid=%d stopped beating %d ms ago; killing it", self.node, r.name,
                            r.proc.pid, now - beat)
                r.proc.kill()

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGCHLD:
            self._child_exited = True
        else:
            self._stop_requested = True

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(s, self._on_signal)

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Run the node in the foreground until SIGTERM/SIGINT; returns the exit code."""
        self._lock_store()
        try:
            # The handlers first, before anything this node must clean up exists: a SIGTERM
            # (the parent-death signal of a killed launcher, say) while the block is being
            # created would otherwise kill the supervisor at once, before its resource tracker
            # knew the block, and leave it in /dev/shm. Now it only asks the loop to stop.
            self._install_signals()
            # The zygote first: its interpreter and the roles' imports (~0.2 s of CPU) then run
            # beside the port check, the metrics server and the block, not after them.
            self._make_run_dir()
            self._plan_roles()
            self._start_zygote()
            self._check_ports()
            self._start_metrics()
            self.state = SharedState.create(state_name(self.cfg), len(self.cfg.peer_ids),
                                            self.cfg.self_slot, role="supervisor")
            log.info("%s node starting: group=%s peers=%s store=%s roles=%s", self.node, self.cfg.group,
                     self.cfg.peers, self.store_dir, ",".join(r.name for r in self.roles))
            if self.cfg.keys_dir:
                log.info("%s secure mode: CurveZMQ on the data and elector ports, keys from %s",
                         self.node, self.cfg.keys_dir)
            else:
                log.warning("%s plain mode: no keys_dir, anyone who reaches the data and elector "
                            "ports is a member and a client%s", self.node,
                            " (--insecure: on a non-loopback address)" if self.cfg.insecure else "")
            if not self._stop_requested:  # a stop during start-up: nothing to start
                self._spawn_handler_first()
            self._loop()
        finally:
            self._shutdown()
        if self._fatal:
            print(f"dledger server: error: {self._fatal}", file=sys.stderr)
            return 1
        return 0

    def _loop(self) -> None:
        last = monotonic_ms()
        while not self._stop_requested and self._fatal is None:
            now = monotonic_ms()
            timeouts = [r.restart_at_ms - now for r in self.roles if r.restart_at_ms is not None]
            if self._stages:
                timeouts.append(STARTUP_POLL_MS)
            timeout = max(0, min([SLOT_POLL_MS, *timeouts])) / 1000
            try:
                select.select([self._wake_r], [], [], timeout)
            except InterruptedError:
                pass
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            now = monotonic_ms()
            gap, last = now - last, now
            self._child_exited = False
            self._reap()
            if self._stop_requested or self._fatal:
                break
            if self._stages and (self._stage_ready() or now >= self._stage_deadline):
                self._next_stage()
            self._follow_slots()
            for r in self.roles:
                if r.proc is None and r.restart_at_ms is not None and now >= r.restart_at_ms \
                        and not r.retiring:
                    self._spawn(r)
            self._watchdog(now, gap - int(timeout * 1000))

    def _shutdown(self) -> None:
        if self._metrics is not None:  # before the block is closed under a scrape
            self._metrics.close()
            self._metrics = None
        live = [r for r in self.roles if r.proc is not None and r.proc.poll() is None]
        for r in live:
            r.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.stop_grace_ms / 1000
        for r in live:
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s %s pid=%d ignored SIGTERM; killing", self.node, r.name, r.proc.pid)
                r.proc.kill()
                r.proc.wait()
        self._stop_zygote()
        if self.state is not None:
            self.state.unlink()
            self.state.close()
            self.state = None
        stop_resource_tracker()  # reaped here, not orphaned to PID 1 inside our process group
        (self.store_dir / "run.json").unlink(missing_ok=True)
        if self.run_dir is not None and self._own_run_dir:
            release_run_dir(self.run_dir, self._run_dir_fd)
            self._run_dir_fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._wake_w >= 0:
            signal.set_wakeup_fd(-1)
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
        log.info("%s node stopped", self.node)
