"""A local group of `dledger server` processes that a tool starts and stops itself.

Used by `make run` (tools/demo.py), `dledger bench --local N`, `dledger chaos` and
tools/bench/failover.py: free loopback ports, stores in a temporary directory, each node in its
own process group so a "crash" is one SIGKILL to all its processes, and everything stopped by
PID in `close()`. Servers are tied to the *thread* that started them (Linux PDEATHSIG): start
them from a thread that lives as long as the group, as the tools do from their main thread.

Footprint and clean-up: segment files are 64 MiB data / 8 MiB index unless the tool passes its
own sizes (a demo should not reserve gigabytes). The temporary directory goes in `close()`;
SIGTERM is turned into SystemExit while a group runs (when the tool left SIGTERM at its default)
so `finally: group.close()` runs then too; and a directory left by a tool that was SIGKILLed is
reclaimed by the next LocalGroup (node.host.rundirs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import zmq

from ipc import protocol as P
from ipc.codes import Role
from node.config import LOCAL_DATA_FILE_SIZE, LOCAL_INDEX_FILE_SIZE
from node.host.interpreter import child_env, module_command
from node.host.rundirs import make_owned_tempdir, release
from node.roles.runtime import die_with_parent
from node.wiring.ports import free_port_pairs

TEMP_PREFIX = "dledger-local-"


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def process_tree(pid: int) -> list[int]:
    """`pid` and every live process below it; [] once it has exited."""
    try:
        proc = psutil.Process(pid)
        return [proc.pid, *(c.pid for c in proc.children(recursive=True))]
    except psutil.Error:  # it exited meanwhile
        return []


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of those of `pids` still alive."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class LocalGroup:
    def __init__(self, n: int, extra_args: list[str] | None = None, root: str | None = None,
                 group: str = "default", hosts: list[str] | None = None, secure: bool = False) -> None:
        """`hosts`: one loopback address per node (default 127.0.0.1 for all); distinct ones
        let routing rules cut one node off (`dledger chaos` partitions). `secure`: CurveZMQ keys
        for the group under its directory (`key_file`: an admin client's); plain by default, a
        loopback test harness (docs/operations.md "Security")."""
        self._own_root = root is None
        self._root_fd: int | None = None
        if root:
            self.root = Path(root)
        else:
            self.root, self._root_fd = make_owned_tempdir(TEMP_PREFIX)
        self._old_sigterm: object = None
        self.group = group
        self.ports = free_port_pairs(n)
        self.ids = [f"n{i}" for i in range(n)]
        self.hosts = dict(zip(self.ids, hosts or ["127.0.0.1"] * n, strict=True))
        self.peers = ";".join(f"{i}-{self.hosts[i]}:{p}" for i, p in zip(self.ids, self.ports, strict=True))
        self.extra = list(extra_args or [])
        self.procs: dict[str, subprocess.Popen] = {}
        self.cwd: str | None = None  # run the servers from another checkout (tools/bench/restart.py)
        self.ctx = zmq.Context()
        self.key_file: Path | None = None
        self._curve = None
        if secure:
            from ipc.security import client_curve, local_group_keys

            self.key_file = local_group_keys(self.root / "keys", self.ids)
            self._curve = client_curve(self.key_file)
            self.extra += ["--keys-dir", str(self.root / "keys")]

    def dealer(self, nid: str) -> zmq.Socket:
        """A DEALER to node `nid`'s data port (a CURVE client when the group is secure)."""
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            self._curve.apply(s, nid)
        s.connect(f"tcp://{self.hosts[nid]}:{self.ports[self.ids.index(nid)]}")
        return s

    # ---- processes -------------------------------------------------------------------------
    def start(self, nid: str | None = None) -> LocalGroup:
        self._catch_sigterm()
        for x in [nid] if nid else self.ids:
            log = open(self.root / f"{x}.log", "ab")  # noqa: SIM115 - handed to the child
            try:
                self.procs[x] = subprocess.Popen(
                    module_command("tools.cli", "server", "--id", x, "--peers", self.peers,
                                   "--group", self.group, "--store-dir", str(self.root / x),
                                   "--data-file-size", str(LOCAL_DATA_FILE_SIZE),
                                   "--index-file-size", str(LOCAL_INDEX_FILE_SIZE), *self.extra),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                    cwd=self.cwd, env=child_env(root=self.cwd),  # --code-dir: that checkout's code
                    # If the tool dies without close() (SIGKILL, the OOM killer), each server
                    # gets SIGTERM and stops cleanly instead of running on unowned.
                    preexec_fn=die_with_parent)
            finally:
                log.close()
        return self

    def kill(self, nid: str) -> None:
        """SIGKILL a node's whole process group (a crash), and reap it."""
        os.killpg(self.procs[nid].pid, signal.SIGKILL)
        self.procs[nid].wait()

    def pids(self) -> list[int]:
        """Every process of every node (supervisors and their role children)."""
        return [pid for p in self.procs.values() if p.poll() is None for pid in process_tree(p.pid)]

    def cpu_seconds(self) -> float:
        """User + system CPU of every live process of the group."""
        return cpu_seconds(self.pids())

    def rss_by_process(self) -> dict[int, int]:
        """Anonymous resident memory (bytes) per pid: to check memory stays flat under load.
        (Plain RSS would also count the touched pages of the mapped store files, which grow
        with the log by design and belong to the page cache; rss - shared is /proc's RssAnon.)"""
        out = {}
        for pid in self.pids():
            try:
                m = psutil.Process(pid).memory_info()
                out[pid] = m.rss - m.shared
            except psutil.Error:
                pass
        return out

    # ---- queries ---------------------------------------------------------------------------
    def meta(self, nid: str, timeout_ms: int = 200) -> P.MetadataResponse | None:
        s = self.dealer(nid)
        try:
            s.send(P.encode(P.MetadataRequest(self.group, nid, request_id=1)))
            if s.poll(timeout_ms):
                m = P.decode(s.recv())
                return m if isinstance(m, P.MetadataResponse) else None
            return None
        finally:
            s.close()

    def metas(self, nids: list[str], timeout_ms: int = 200) -> dict[str, P.MetadataResponse | None]:
        """METADATA of several nodes, asked of all at once: a node that does not answer yet
        (still starting) costs one `timeout_ms`, not one per node."""
        out: dict[str, P.MetadataResponse | None] = dict.fromkeys(nids)
        socks: dict[zmq.Socket, str] = {}
        poller = zmq.Poller()
        try:
            for nid in nids:
                s = self.dealer(nid)
                socks[s] = nid
                s.send(P.encode(P.MetadataRequest(self.group, nid, request_id=1)))
                poller.register(s, zmq.POLLIN)
            deadline = time.monotonic() + timeout_ms / 1000
            waiting = len(socks)
            while waiting and (left := deadline - time.monotonic()) > 0:
                for s, _ in poller.poll(max(1, int(left * 1000))):
                    poller.unregister(s)
                    waiting -= 1
                    m = P.decode(s.recv())
                    out[socks[s]] = m if isinstance(m, P.MetadataResponse) else None
        finally:
            for s in socks:
                s.close()
        return out

    def leader(self, among: list[str] | None = None) -> tuple[str, int] | None:
        """(leader id, term) when every node in `among` answers and agrees, else None."""
        views = list(self.metas(among or self.ids).values())
        if any(v is None for v in views):
            return None
        leaders = [v for v in views if v.role == Role.LEADER]
        if len(leaders) == 1 and all(v.leader_id == leaders[0].self_id and v.term == leaders[0].term
                                     for v in views):
            return leaders[0].self_id, leaders[0].term
        return None

    def wait_leader(self, among: list[str] | None = None, timeout: float = 30) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.leader(among)
            if got:
                return got
            time.sleep(0.01)
        raise RuntimeError(f"no agreed leader among {among or self.ids} within {timeout}s "
                           f"(logs in {self.root})")

    # ---- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.ctx.destroy(linger=0)
        if self._own_root:
            release(self.root, self._root_fd)
            self._root_fd = None
        self._restore_sigterm()

    def _catch_sigterm(self) -> None:
        """SIGTERM -> SystemExit while the group runs, so the tool's `finally: close()` removes
        the stores; only when the tool has no SIGTERM handler of its own, and only from the
        main thread (where Python runs signal handlers)."""
        if self._old_sigterm is not None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._old_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._old_sigterm)  # type: ignore[arg-type]
            self._old_sigterm = None

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
