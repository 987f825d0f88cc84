"""Faults a chaos run injects into a local group, one at a time, from a seeded schedule.

- ``kill``: SIGKILL every process of a node (a machine crash), restart it after the fault's
  duration.
- ``pause``: SIGSTOP every process of a node for the duration, then SIGCONT (a VM stall, a
  long GC pause): the node wakes up believing whatever it believed before.
- ``role-kill``: SIGKILL one role process of a node (handler, elector, ack checker or a
  dispatcher); its supervisor restarts it.
- ``partition``: cut a node off from the other nodes (``peers``; clients still reach it) or
  from everyone (``all``) for the duration. Needs root: the run moves into a private network
  namespace (nothing outside it is touched, and it vanishes with the run), gives each node its
  own loopback address, has nodes connect from their own address (`connect_from_own_host`),
  and blackholes traffic between addresses with policy-routing rules.

The schedule is a function of the seed alone (kinds, targets, durations, gaps), so a run can
be replayed; the timing of what the processes do meanwhile is not.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tools.local_group import LocalGroup

KINDS = ("kill", "pause", "role-kill", "partition")
ROLES = ("handler", "elector", "ack_checker", "dispatcher")
CLIENT_HOST = "127.0.0.1"
_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, slots=True)
class Fault:
    number: int
    kind: str
    on_leader: bool  # target the leader, else a follower
    pick: float  # which follower (index = int(pick * followers)), drawn up front for replay
    duration: float  # seconds the node is down / paused / cut off; 0 for role-kill
    gap: float  # quiet seconds before the fault
    role: str = ""  # role-kill: which role
    scope: str = ""  # partition: "peers" or "all"

    def describe(self, node: str) -> str:
        what = {"kill": f"kill {node}", "pause": f"pause {node}",
                "role-kill": f"role-kill {node}/{self.role}",
                "partition": f"partition {node} from {'the other nodes' if self.scope == 'peers' else 'everyone'}"}
        return what[self.kind] + (f" for {self.duration:.2f} s" if self.duration else "")


class Schedule:
    """An endless, seeded sequence of faults drawn from `kinds`."""

    def __init__(self, seed: int, kinds: list[str], *, leader_share: float = 0.6,
                 max_duration: float = 2.5, min_gap: float = 1.0, max_gap: float = 3.0,
                 roles: tuple[str, ...] = ROLES) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise ValueError(f"unknown fault kind(s) {unknown or kinds}: choose from {', '.join(KINDS)}")
        self.rng = random.Random(seed)
        self.kinds, self.leader_share, self.roles = list(kinds), leader_share, roles
        self.max_duration, self.min_gap, self.max_gap = max_duration, min_gap, max_gap
        self.count = 0

    def next(self) -> Fault:
        r = self.rng
        # Draw every field every time, in a fixed order, so one fault's draws never depend on
        # another's kind: the same seed gives the same schedule for any subset of kinds.
        kind = r.choice(self.kinds)
        on_leader = r.random() < self.leader_share
        pick = r.random()
        duration = round(r.uniform(0.2, self.max_duration), 2)
        gap = round(r.uniform(self.min_gap, self.max_gap), 2)
        role = r.choice(self.roles)
        scope = "peers" if r.random() < 0.7 else "all"
        self.count += 1
        return Fault(self.count, kind, on_leader, pick, 0.0 if kind == "role-kill" else duration, gap,
                     role if kind == "role-kill" else "", scope if kind == "partition" else "")


# ---- private network (partitions) ---------------------------------------------------------
def enter_private_network() -> str | None:
    """Move this process into a new network namespace with loopback up and policy routing
    ready for blackhole rules. Returns None on success, else why partitions cannot run.
    Must be called before any thread or socket exists: only the calling thread (and what it
    starts afterwards) moves."""
    if os.geteuid() != 0:
        return f"partition needs root for a private network namespace (running as uid {os.geteuid()})"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNET) != 0:
            return f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}"
    except OSError as e:
        return f"unshare(CLONE_NEWNET) unavailable: {e}"
    try:
        # Rules at preference 10 must be consulted before the local table, which sits at 0.
        for cmd in (["ip", "link", "set", "lo", "up"],
                    ["ip", "rule", "add", "pref", "100", "lookup", "local"],
                    ["ip", "rule", "del", "pref", "0", "lookup", "local"]):
            _ip(cmd)
    except (OSError, RuntimeError) as e:
        return f"cannot set up the private network: {e}"
    return None


def _ip(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip() or p.returncode}")


def node_hosts(n: int) -> list[str]:
    """One loopback address per node, distinct from the clients' (127.0.0.1)."""
    return [f"127.0.0.{11 + i}" for i in range(n)]


# ---- injection ----------------------------------------------------------------------------
class Injector:
    """Starts and heals faults on a LocalGroup. `heal_all` undoes whatever is still in force
    (called in `finally`: no paused, dead or cut-off node outlives the run)."""

    def __init__(self, group: LocalGroup) -> None:
        self.g = group
        self.paused: set[str] = set()
        self.down: set[str] = set()
        self.cut: dict[str, list[list[str]]] = {}

    def start(self, fault: Fault, node: str) -> str:
        """Inject `fault` on `node`; returns a detail for the report (e.g. the pid killed)."""
        if fault.kind == "kill":
            self.g.kill(node)
            self.down.add(node)
            return ""
        if fault.kind == "pause":
            os.killpg(self.g.procs[node].pid, signal.SIGSTOP)
            self.paused.add(node)
            return ""
        if fault.kind == "role-kill":
            pid = self.role_pid(node, fault.role)
            if pid is None:
                return "role not running"
            os.kill(pid, signal.SIGKILL)
            return f"pid {pid}"
        if fault.kind == "partition":
            me = self.g.hosts[node]
            others = [self.g.hosts[x] for x in self.g.ids if x != node]
            if fault.scope == "all":
                others.append(CLIENT_HOST)
            rules = [r for o in others for r in (["from", me, "to", o], ["from", o, "to", me])]
            self.cut[node] = []
            for r in rules:
                _ip(["ip", "rule", "add", "pref", "10", *r, "blackhole"])
                self.cut[node].append(r)
            return ""
        raise ValueError(fault.kind)

    def heal(self, fault: Fault, node: str) -> None:
        if fault.kind == "kill" and node in self.down:
            self.g.start(node)
            self.down.discard(node)
        elif fault.kind == "pause" and node in self.paused:
            os.killpg(self.g.procs[node].pid, signal.SIGCONT)
            self.paused.discard(node)
        elif fault.kind == "partition":
            for r in self.cut.pop(node, []):
                _ip(["ip", "rule", "del", "pref", "10", *r, "blackhole"])

    def heal_all(self) -> None:
        for node in list(self.paused):
            try:
                os.killpg(self.g.procs[node].pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.paused.clear()
        for node in list(self.cut):
            for r in self.cut.pop(node):
                try:
                    _ip(["ip", "rule", "del", "pref", "10", *r, "blackhole"])
                except RuntimeError:
                    pass
        for node in list(self.down):
            self.g.start(node)
        self.down.clear()

    def role_pid(self, node: str, role: str) -> int | None:
        """The pid of `node`'s role process (the first dispatcher for "dispatcher"), from the
        supervisor's children's command lines."""
        sup = self.g.procs[node].pid
        try:
            children = Path(f"/proc/{sup}/task/{sup}/children").read_text().split()
        except OSError:
            return None
        for c in children:
            try:
                argv = Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"node.roles.{role}".encode() in argv:
                return int(c)
        return None
