"""A real local group for integration tests (hashicorp's MakeCluster, with real processes).

Each node is a `dledger server` process in its own session (process group), on free loopback
ports, with its store in the test's tmp_path. Faults are real signals: to the whole node's
process group (SIGKILL/SIGSTOP/SIGCONT a node) or to one role process (found through
/proc/<pid>/task/<pid>/children). Everything started is stopped by PID in `close()`, which
also checks that no shared-memory segment of ours is left in /dev/shm.

`Monitor` polls every node's METADATA in a background thread and records, per term, which
nodes claimed LEADER — the "never two leaders in one term" invariant is checked against it.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import zmq

from ipc import protocol as P
from ipc.codes import ResponseCode, Role
from node.block.shared_state import segment_name
from node.store.layout import read_layout
from node.store.segment_store import SegmentStore, StoreConfig
from node.wiring.ports import free_port_pairs

ROOT = Path(__file__).resolve().parents[2]


def wait_for(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> object:
    """Poll `cond` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - a node may be restarting; keep polling
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" +
                         (f" (last error: {last_exc!r})" if last_exc else ""))


def transfer_to(client, target: str, attempts: int = 5, timeout: float = 20.0):  # noqa: ANN001, ANN201
    """Make `target` the leader through `client.transfer_leadership`, tried again (up to
    `attempts` times) while the leader answers TAKE_LEADERSHIP_FAILED: a target that did not
    win in time, or that the leader judged stalled (a node just restarted on a loaded machine,
    whose first acknowledgements come late). Any other refusal is raised at once."""
    from ipc.client.results import DLedgerError

    for attempt in range(attempts):
        try:
            return client.transfer_leadership(target, timeout=timeout)
        except DLedgerError as e:
            if e.code != ResponseCode.TAKE_LEADERSHIP_FAILED or attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    return None


class Node:
    def __init__(self, cluster: Cluster, node_id: str, port: int) -> None:
        self.cluster = cluster
        self.id = node_id
        self.port = port
        self.store_dir = cluster.root / node_id
        self.log_path = cluster.root / f"{node_id}.log"
        self.proc: subprocess.Popen | None = None
        self.stopped = False  # SIGSTOPped
        self.crashed = False  # SIGKILLed whole and not restarted: its segment may remain
        self.flags: list[str] = []  # this node's own flags after the group's (e.g. --metrics-port)
        self.join: str | None = None  # a node that joins: the members' peers string (`add_joiner`)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None
        members = (["--join", self.join, "--address", self.address] if self.join is not None
                   else ["--peers", self.cluster.peers])
        cmd = [sys.executable, "-m", "tools.cli", "server", "--id", self.id, *members,
               "--store-dir", str(self.store_dir), *self.cluster.flags, *self.flags]
        extra_path = self.cluster.env.get("PYTHONPATH")  # e.g. a test's own state machine module
        env = {**os.environ, **self.cluster.env,
               "PYTHONPATH": str(ROOT) + (os.pathsep + extra_path if extra_path else "")}
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                         start_new_session=True, cwd=str(ROOT))
        finally:
            log.close()
        self.stopped = self.crashed = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Signal the whole node (supervisor and every role): its own process group."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGSTOP:
            self.stopped = True
        elif sig == signal.SIGCONT:
            self.stopped = False

    def kill(self) -> None:
        """SIGKILL the node (all its processes at once, like a machine crash) and reap it."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reap_group()
        self.crashed = True

    def stop(self) -> int | None:
        """Clean stop (SIGTERM to the supervisor); SIGKILL the group if it hangs."""
        if self.proc is None:
            return None
        if self.stopped:
            self.signal(signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._reap_group()
        return self.proc.returncode

    def _reap_group(self) -> None:
        """Make sure no process of this node's group survives (orphaned roles included). A
        zombie does not count: it holds no port, lock or mapping, and the roles of a SIGKILLed
        node are orphans that only PID 1 reaps, which takes over a second on some hosts."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not group_has_live_process(self.proc.pid):
                return
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def role_pids(self) -> dict[str, int]:
        """{role module name: pid} of the supervisor's live children."""
        assert self.proc is not None
        out: dict[str, int] = {}
        try:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return out
        for k in kids:
            try:
                cmd = Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            args = [c.decode() for c in cmd if c]
            if "-m" in args:
                mod = args[args.index("-m") + 1].rsplit(".", 1)[-1]
                if "--peer" in args:
                    mod += "-" + args[args.index("--peer") + 1]
                out[mod] = int(k)
        return out

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def shm_name(self) -> str:
        return segment_name(self.cluster.group, self.id, os.path.abspath(self.store_dir))


def interruptible() -> None:
    """`preexec_fn` for a command a test will stop with SIGINT: SIGINT and SIGQUIT back to their
    defaults, as a terminal starts a command. A test run started in the background of a
    non-interactive shell (`make test &`) ignores both, a child inherits that through exec, and
    Python then never raises KeyboardInterrupt in it (found with the signal state in a failure)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def wait_after_signal(proc: subprocess.Popen, timeout: float, what: str) -> tuple[int, bytes]:
    """(exit code, stderr) of `proc` once it exits, reading its pipes meanwhile (a child that
    fills a pipe nobody reads blocks in its write and never exits); past `timeout`, an
    AssertionError that says how the process treats signals (its /proc status), what it wrote
    to stderr and where its threads are (py-spy, when installed)."""
    try:
        _out, err = proc.communicate(timeout=timeout)
        return proc.returncode, err or b""
    except subprocess.TimeoutExpired as e:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        except OSError:
            status = []
        sig = [ln for ln in status if ln.startswith(("State", "SigBlk", "SigIgn", "SigCgt"))]
        spy = Path(sys.executable).parent / "py-spy"
        dump = "(no py-spy)"
        if spy.exists():
            dump = subprocess.run([str(spy), "dump", "--pid", str(proc.pid)], capture_output=True,
                                  text=True, timeout=60).stdout
        err = e.stderr or b""
        raise AssertionError(f"{what}: still running {timeout}s later; {sig}\nstderr (last 3000 "
                             f"bytes): {err[-3000:]!r}\n{dump}") from None


def group_has_live_process(pgid: int) -> bool:
    """Whether process group `pgid` has a member that is not a zombie (a /proc scan)."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cluster:
    def __init__(self, root: Path, n: int, group: str = "default", env: dict[str, str] | None = None,
                 **options: object) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.group = group
        self.env = env or {}
        ports = free_port_pairs(n)
        self.nodes = {f"n{i}": Node(self, f"n{i}", p) for i, p in enumerate(ports)}
        self.peers = ";".join(f"{nid}-127.0.0.1:{node.port}" for nid, node in self.nodes.items())
        self.flags = ["--group", group]
        for k, v in options.items():
            self.flags += ["--" + k.replace("_", "-"), str(v)]
        self.ctx = zmq.Context()
        self.monitor: Monitor | None = None
        # A secure group (keys_dir=...): the key file this harness and `client()` speak with.
        self.key_file: Path | None = None

    def _dealer(self, node_id: str) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if self.key_file is not None:
            from ipc.security import client_curve

            client_curve(self.key_file).apply(s, node_id)
        s.connect(f"tcp://{self.nodes[node_id].address}")
        return s

    def start(self) -> Cluster:
        for node in self.nodes.values():
            node.start()
        return self

    def add_joiner(self, node_id: str) -> Node:
        """A new machine (not started): `server --join <the group's peers> --address ...`. It is
        one of `nodes` from now on (stopped with the group); `peers` stays the bootstrap string."""
        (port,) = free_port_pairs(1)
        node = self.nodes[node_id] = Node(self, node_id, port)
        node.join = self.peers
        return node

    # ---- queries ---------------------------------------------------------------------------
    def request(self, node_id: str, msg: P.Message, timeout: float = 0.5) -> P.Message | None:
        """One request to one node's data port; None if it does not answer in time."""
        s = self._dealer(node_id)
        try:
            s.send(P.encode(msg))
            if s.poll(int(timeout * 1000)):
                return P.decode(s.recv())
            return None
        finally:
            s.close()

    def metadata(self, node_id: str, timeout: float = 0.5) -> P.MetadataResponse | None:
        r = self.request(node_id, P.MetadataRequest(self.group, node_id, request_id=1), timeout)
        return r if isinstance(r, P.MetadataResponse) and r.code == ResponseCode.SUCCESS else None

    def views(self, timeout: float = 0.5) -> dict[str, P.MetadataResponse | None]:
        """Every live node's METADATA (None: down, stopped or no answer within `timeout`),
        asked of all nodes at once: a node that does not answer yet (still starting) costs one
        `timeout` per call, not one per node, so a wait on a group just started sees its
        leader as soon as it is there."""
        out: dict[str, P.MetadataResponse | None] = dict.fromkeys(self.nodes)
        socks: dict[zmq.Socket, str] = {}
        poller = zmq.Poller()
        try:
            for nid, n in self.nodes.items():
                if not n.alive or n.stopped:
                    continue
                s = self._dealer(nid)
                socks[s] = nid
                s.send(P.encode(P.MetadataRequest(self.group, nid, request_id=1)))
                poller.register(s, zmq.POLLIN)
            deadline = time.monotonic() + timeout
            waiting = len(socks)
            while waiting and (left := deadline - time.monotonic()) > 0:
                for s, _ in poller.poll(max(1, int(left * 1000))):
                    poller.unregister(s)
                    waiting -= 1
                    r = P.decode(s.recv())
                    if isinstance(r, P.MetadataResponse) and r.code == ResponseCode.SUCCESS:
                        out[socks[s]] = r
        finally:
            for s in socks:
                s.close()
        return out

    def leader(self, among: list[str] | None = None) -> str | None:
        """The leader every answering node in `among` agrees on (same term), else None."""
        views = {k: v for k, v in self.views().items() if among is None or k in among}
        live = [v for v in views.values() if v is not None]
        leaders = [v for v in live if v.role == Role.LEADER]
        if len(leaders) != 1 or not live:
            return None
        lead = leaders[0]
        if all(v.term == lead.term and v.leader_id == lead.self_id for v in live):
            return lead.self_id
        return None

    def wait_leader(self, timeout: float = 10.0, among: list[str] | None = None) -> str:
        try:
            return wait_for(lambda: self.leader(among), timeout, f"one agreed leader among {among or 'all'}")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe()}") from None

    def describe(self, log_lines: int = 8) -> str:
        """Each node's process state, METADATA view and last warnings: what a failed wait shows,
        so a flaky failure in CI can be diagnosed from its output alone."""
        out = []
        for nid, v in self.views().items():
            n = self.nodes[nid]
            state = "stopped" if n.stopped else ("alive" if n.alive else "down")
            view = (f"role={Role(v.role).name} term={v.term} leader={v.leader_id} "
                    f"end={v.ledger_end_index} commit={v.committed_index}") if v else "no answer"
            out.append(f"  {nid} {n.address} {state}: {view}")
            noisy = [ln for ln in n.log_text().splitlines()
                     if any(w in ln for w in ("WARNING", "ERROR", "Error", "Traceback"))]
            out += [f"    | {ln[:200]}" for ln in noisy[-log_lines:]]
        return "\n".join(out)

    def term_of(self, node_id: str) -> int:
        m = self.metadata(node_id)
        assert m is not None, f"{node_id} did not answer"
        return m.term

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        for node in self.nodes.values():  # all at once: one by one would trigger elections
            if node.alive:
                if node.stopped:
                    node.signal(signal.SIGCONT)
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            node.stop()
        self.ctx.destroy(linger=0)
        # A node SIGKILLed whole (its resource tracker too) leaves its segment until it starts
        # again (the next supervisor removes the stale one); a cleanly stopped node never does.
        left = []
        for n in self.nodes.values():
            seg = Path("/dev/shm", n.shm_name())
            if seg.exists():
                seg.unlink(missing_ok=True)
                if not n.crashed:
                    left.append(seg.name)
        assert not left, f"shared-memory segments left behind by cleanly stopped nodes: {left}"

    def client(self, **kw: object):  # noqa: ANN201 - ipc.client.DLedgerClient
        from ipc.client import DLedgerClient

        kw.setdefault("timeout", 10.0)
        if self.key_file is not None:
            kw.setdefault("key_file", self.key_file)
        return DLedgerClient(self.peers, group=self.group, **kw)

    def converged(self, among: list[str] | None = None) -> bool:
        """Every answering node in `among` has the same ledger end, all of it committed."""
        views = [v for k, v in self.views().items() if among is None or k in among]
        if not views or any(v is None for v in views):
            return False
        ends = {(v.ledger_end_index, v.committed_index) for v in views}
        return len(ends) == 1 and next(iter(ends))[0] == next(iter(ends))[1]

    def wait_converged(self, timeout: float = 20.0, among: list[str] | None = None) -> None:
        try:
            wait_for(lambda: self.converged(among), timeout, f"replicas {among or 'all'} converge")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe()}") from None

    def start_monitor(self, interval: float = 0.05) -> Monitor:
        self.monitor = Monitor(self, interval)
        return self.monitor


def read_log(store_dir: Path) -> list[tuple[int, int, int, bytes]]:
    """(index, term, magic, body) of every entry of a STOPPED node's store."""
    lay = read_layout(store_dir)
    if not lay.data:
        return []
    st = SegmentStore(StoreConfig(store_dir=str(store_dir), data_file_size=lay.data_file_size,
                                  index_file_size=lay.index_file_size or 32 * 5_242_880))
    st.open()
    try:
        if st.ledger_end_index < 0:
            return []
        return [(e.index, e.term, e.magic, bytes(e.body))
                for e in (st.get(i) for i in range(st.ledger_begin_index, st.ledger_end_index + 1))]
    finally:
        st.close()


class Monitor(threading.Thread):
    """Records every (term, node) LEADER claim seen; `violations()` lists terms with two."""

    def __init__(self, cluster: Cluster, interval: float) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.interval = interval
        self.leaders_by_term: dict[int, set[str]] = defaultdict(set)
        self.leader_changes = 0
        self._last_leader: str | None = None
        self._stop_evt = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._stop_evt.wait(self.interval):
            for nid, node in list(self.cluster.nodes.items()):
                if not node.alive or node.stopped:
                    continue
                m = self.cluster.metadata(nid, timeout=0.2)
                if m is not None and m.role == Role.LEADER:
                    self.leaders_by_term[m.term].add(nid)
                    if nid != self._last_leader:
                        self.leader_changes += 1
                        self._last_leader = nid

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)

    def violations(self) -> dict[int, set[str]]:
        return {t: s for t, s in self.leaders_by_term.items() if len(s) > 1}


class AppendWriter(threading.Thread):
    """Appends unique numbered bodies (`NAME-000123`) through `client`, `depth` in flight (1 = one
    at a time), recording each acknowledged body's index and each error, until `stop`."""

    def __init__(self, client, name: str, depth: int, close_client: bool = False) -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.client, self.name, self.depth, self.close_client = client, name, depth, close_client
        self.acked: dict[bytes, int] = {}
        self.errors: list[Exception] = []
        self._stop_evt = threading.Event()
        self.start()

    def run(self) -> None:
        from ipc.client import DLedgerError

        n = 0
        inflight: collections.deque = collections.deque()
        while not self._stop_evt.is_set() or inflight:
            while not self._stop_evt.is_set() and len(inflight) < self.depth:
                body = b"%s-%06d" % (self.name.encode(), n)
                n += 1
                inflight.append((body, self.client.append_async(body)))
            body, fut = inflight.popleft()
            try:
                self.acked[body] = fut.result().index
            except DLedgerError as e:
                self.errors.append(e)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=60)
        if self.close_client:
            self.client.close()


def assert_acked_once_everywhere(cluster: Cluster, writers: list[AppendWriter]) -> None:
    """Every STOPPED node's log holds each acknowledged body exactly once, at the index it was
    acknowledged with, and no body twice (the exactly-once promise, checked on every replica)."""
    acked = {b: i for w in writers for b, i in w.acked.items()}
    for node in cluster.nodes.values():
        log = read_log(node.store_dir)
        bodies = collections.Counter(body for _i, _t, magic, body in log if magic == 1)
        twice = [b for b, k in bodies.items() if k > 1]
        assert not twice, f"{node.id}: written twice: {twice[:5]}"
        at = {body: index for index, _t, magic, body in log if magic == 1}
        assert all(at.get(b) == i for b, i in acked.items()), f"{node.id}: an acknowledged body moved or is missing"

