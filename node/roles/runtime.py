"""What every role process does before its own loop: the same start-up, logging and stop rules.

A role is started by the supervisor as `python -m node.roles.<role> --config RUN_DIR/config.json
[--peer ID]`. It then: asks the kernel to SIGTERM it if the supervisor dies (so no role is ever
left half-alive without its supervisor), installs SIGTERM/SIGINT handlers that only set a flag
(the loop notices within one poll timeout), attaches the shared block without the resource
tracker, repairs seqlocks a killed predecessor may have left odd, creates its ZeroMQ context
(after the process started: contexts never cross a fork), and logs with node id, role and pid.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, NoReturn

import zmq

from ipc.security import ClientCurve, ServerKeys, Zap, load_server_keys, member_curve
from ipc.sockets import ipc_path, make_context
from node.block.shared_state import SegmentNotFound, SharedState, monotonic_ms
from node.block.state_protocol import StateBlock
from node.config import NodeConfig, configure_logging
from node.roles.names import EXIT_FATAL, FATAL_FILE_PREFIX, fatal_file, state_name  # noqa: F401 - re-exported
from node.store.segment_store import disk_usage_ratio
from node.wiring import channels
from node.wiring.doorbells import Doorbell
from node.wiring.slot_file import SlotFile, SlotFileError

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: deliver SIGTERM to this process when its parent (the supervisor) dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - non-Linux: the ppid check covers it
        pass


_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MALLOC_MMAP_THRESHOLD = 32 << 20
"""Buffers below this come from the heap, not from a fresh mmap each (glibc's maximum)."""
MALLOC_TRIM_THRESHOLD = 64 << 20
"""Free heap above this is given back to the kernel; below it, kept for the next buffer."""


def keep_buffers_in_heap() -> bool:
    """glibc: stop each push-sized buffer (a frame the dispatcher encodes, the copy ZeroMQ
    sends, the frame a follower receives: ~100 KiB-4 MiB) from being a fresh mmap that the
    process page-faults in and unmaps again, or heap the allocator trims and faults back.

    Why: perf on the 1 KiB and 128 B bench lines showed up to a tenth of a dispatcher's CPU
    in anonymous page faults under memmove. glibc's dynamic threshold starts at 128 KiB and
    only follows the largest freed mmap, and its 2x trim threshold gives back the heap top
    whenever two frames were freed together. Fixed thresholds keep a role's working set of
    buffers mapped: at most MALLOC_TRIM_THRESHOLD of free heap stays per process. Returns
    False where there is no glibc `mallopt` (musl, macOS): nothing changes there."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


def setup_logging(node_id: str, role: str, debug: bool = False, level: str = "info",
                  fmt: str = "text") -> logging.Logger:
    """The node's --log-level/--log-format (node.config.configure_logging, shared with the CLI
    and the supervisor so every process of a node writes the same kind of line)."""
    configure_logging(level, fmt, node=node_id, role=role, debug=debug)
    return logging.getLogger(f"dledger.{role.split('[')[0]}")


@dataclass
class RoleContext:
    """Everything a role loop needs, created in the role's own process."""

    cfg: NodeConfig
    role: str  # "elector", "handler", "ack_checker", "dispatcher[2]"
    log: logging.Logger
    state: StateBlock  # SharedState here; MemoryState in the unit tests and the simulator
    zctx: zmq.Context
    run_dir: Path
    peer_id: str | None = None
    wake_fd: int = -1  # readable when a signal arrived: register it in the role's poller
    # A dispatcher's follower: its peer slot and address (the supervisor passes them from the
    # slot table, node.wiring.slot_file); None: its `--peers` position and address.
    peer_slot: int | None = None
    peer_address: tuple[str, int] | None = None
    parent_pid: int = field(default_factory=os.getppid)
    stopping: bool = False
    clock: Callable[[], int] = monotonic_ms  # ms; the simulator passes its virtual clock
    # Seconds since the epoch: a data file's age (retention) and a snapshot's `created`. The
    # simulator passes its virtual time, so its traces never hold a wall-clock value.
    wall_clock: Callable[[], float] = time.time
    # How full the disk under a path is (0..1): the handler's DISK_FULL and retention input.
    # The simulator passes its model of the disk (full while a fault says so).
    disk_usage: Callable[[str], float] = disk_usage_ratio

    # Set on first use, not dataclass fields: what a role reads is the methods below (the
    # simulator's context offers the fields, and runs plain).
    _keys: ClassVar[ServerKeys | None] = None
    _zap: ClassVar[Zap | None] = None

    def server_keys(self) -> ServerKeys | None:
        """This node's keys (read once per role process), or None in plain mode."""
        if not self.cfg.keys_dir:
            return None
        if self._keys is None:
            self._keys = load_server_keys(self.cfg.keys_dir, self.cfg.id, self.cfg.peer_ids)
        return self._keys

    def curve_server(self, domain: str) -> tuple[ServerKeys, str] | None:
        """`ipc.sockets.router`'s `curve` for a public port of this role, starting the process's
        ZAP handler on first use (a CURVE server without one would admit any key)."""
        keys = self.server_keys()
        if keys is None:
            return None
        if self._zap is None:
            run_dir = self.run_dir

            def added_members() -> dict[bytes, str]:  # in the authenticator's thread: its own reader
                return {k.encode(): mid for mid, k in _slot_member_keys(run_dir).items()}

            self._zap = Zap(self.zctx, keys, added_members)
        return keys, domain

    def peer_curve(self, peer_id: str) -> tuple[ClientCurve, str] | None:
        """`ipc.sockets.dealer`'s `curve` to member `peer_id`'s public ports: as this member. A
        member added after this process read its keys is reached with the key its
        configuration entry names (the node's slot table)."""
        keys = self.server_keys()
        if keys is None:
            return None
        if peer_id not in keys.member_public:
            key = _slot_member_keys(self.run_dir).get(peer_id)
            if key:
                keys.member_public[peer_id] = key.encode()
                keys.member_keys.setdefault(key.encode(), peer_id)
        return member_curve(keys), peer_id

    def auth_refused(self) -> int:
        """Handshakes this process's ZAP handler refused (unknown keys)."""
        return 0 if self._zap is None else self._zap.refused

    def ipc(self, name: str) -> str:
        return ipc_path(self.run_dir, name)

    def channel(self, ch: channels.Channel) -> str:
        """The ipc:// endpoint of one of the node's declared channels (node.wiring.channels)."""
        return channels.endpoint(self.run_dir, ch)

    def open(self, ch: channels.Channel) -> zmq.Socket:
        """This role's end of a declared channel, opened as node.wiring.channels declares it."""
        return channels.open_channel(self.zctx, self.run_dir, ch, self.role)

    def bell(self, bell: channels.Bell, slot: int | None = None) -> Doorbell:
        """This role's end of a declared doorbell (node.wiring.channels), in the run directory:
        the same pipe for every process of the node, and again for a restarted role.

        A run directory where no named pipe can be made (a file system without FIFOs, a file
        in the way) stops the node with one line (`fatal`): a restart would fail the same way."""
        try:
            return channels.open_bell(self.run_dir, bell, self.role, slot)
        except OSError as e:
            self.fatal(f"cannot open the doorbell {bell.file_name(slot)} in the run directory "
                       f"{self.run_dir}: {e.strerror or e}")

    def should_stop(self) -> bool:
        """True once SIGTERM/SIGINT arrived or the supervisor is gone."""
        return self.stopping or os.getppid() != self.parent_pid

    def drain_wake(self) -> None:
        try:
            while os.read(self.wake_fd, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def beat(self) -> None:
        self.state.beat(self.role, self.clock())

    def fatal(self, message: str) -> NoReturn:
        """Stop this role for good: the node cannot work (a damaged file, a store it cannot
        write). Restarting would only crash again, and a node with one role missing answers
        but does not elect or replicate, so the supervisor stops the whole node and prints
        `message` as its one error line.

        Logs `message` at ERROR as the role's last line, leaves it in `RUN_DIR/fatal-<role>`
        for the supervisor, and exits with EXIT_FATAL (SystemExit: `finally` blocks still
        close sockets and the shared block)."""
        line = " ".join(message.splitlines()).strip()  # one line, whatever the cause's text
        self.log.error("%s", line)
        try:
            fatal_file(self.run_dir, self.role).write_text(line + "\n", encoding="utf-8")
        except OSError as e:  # the supervisor then reports the exit status instead
            self.log.error("cannot write %s: %s", fatal_file(self.run_dir, self.role), e)
        raise SystemExit(EXIT_FATAL)

    def close(self) -> None:
        if self._zap is not None:
            self._zap.stop()
        self.zctx.destroy(linger=0)
        self.state.close()


def load_run_config(path: str | os.PathLike[str]) -> NodeConfig:
    return NodeConfig.from_json(Path(path).read_text(encoding="utf-8"))


def _slot_member_keys(run_dir: Path) -> dict[str, str]:
    """{member id: Z85 key} the node's slot table names (members added by configuration
    entries); {} when there is none or it cannot be read (the key stays unknown: refused)."""
    try:
        table = SlotFile(run_dir).read()
    except SlotFileError:
        return {}
    return {} if table is None else table.member_keys()


def role_main(role: str, run: Callable[[RoleContext], None], argv: list[str] | None = None) -> int:
    """Entry point shared by every role module's `main()`."""
    ap = argparse.ArgumentParser(prog=f"dledger-{role}")
    ap.add_argument("--config", required=True)
    ap.add_argument("--peer", default=None, help="dispatcher only: the follower it serves")
    ap.add_argument("--slot", type=int, default=None, help="dispatcher only: the follower's peer slot")
    ap.add_argument("--address", default=None, help="dispatcher only: the follower's HOST:PORT")
    ap.add_argument("--debug", action="store_true")
    args = ap.parse_args(argv)
    die_with_parent()
    keep_buffers_in_heap()
    cfg = load_run_config(args.config)
    role_name = role
    peer_address = None
    if args.peer is not None:
        slot = args.slot if args.slot is not None else cfg.peer_ids.index(args.peer)
        role_name = f"{role}[{slot}]"
        if args.address is not None:
            host, _, port = args.address.rpartition(":")
            peer_address = (host, int(port))
    log = setup_logging(cfg.id, role_name if args.peer is None else f"{role}-{args.peer}", args.debug,
                        cfg.log_level, cfg.log_format)
    ctx_holder: list[RoleContext] = []
    stop_before_context: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        # A stop that comes before the context exists (while the block is attached) is kept
        # and handed to it: dropped, the role would run on deaf to it until SIGKILL.
        if ctx_holder:
            ctx_holder[0].stopping = True
        else:
            stop_before_context.append(signum)

    # The C-level handler writes to this pipe, so a zmq poll wakes at once on SIGTERM (its
    # loop then sees `stopping`) instead of at its next timeout.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        state = SharedState.attach(state_name(cfg), role=role_name)
    except SegmentNotFound as e:
        # The supervisor that spawned this role is gone (killed while it was starting its
        # roles) and its block with it: nothing to work for. One line, no traceback.
        log.error("%s", e)
        return 1
    repaired = state.repair_seqs(role_name)
    if repaired:
        log.warning("repaired seqlocks left mid-write by a previous incarnation: %s", repaired)
    rc = RoleContext(cfg, role_name, log, state, make_context(), Path(args.config).parent, args.peer,
                     wake_r, peer_slot=args.slot, peer_address=peer_address)
    ctx_holder.append(rc)
    if stop_before_context:  # after the append: a signal from here on sets it directly
        rc.stopping = True
    log.debug("started")
    # Everything imported so far lives as long as the process: out of the collector's way, so
    # a full collection in the handler scans its working set only (~7 ms pauses -> ~1 ms).
    gc.freeze()
    prof_dir = os.environ.get("DLEDGER_PROFILE_DIR")  # where a committed entry's CPU goes, per role
    prof = None
    if prof_dir:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    try:
        run(rc)
    except Exception as e:
        if isinstance(e, zmq.ZMQError) and e.errno == errno.EADDRINUSE:
            log.error("cannot listen: %s", e)  # self-explaining: no traceback; the supervisor retries
        else:
            log.exception("role crashed")
        return 1
    finally:
        if prof is not None:
            prof.disable()
            Path(prof_dir).mkdir(parents=True, exist_ok=True)
            prof.dump_stats(str(Path(prof_dir) / f"{cfg.id}-{role_name}-{os.getpid()}.prof"))
        rc.close()
    return 0
