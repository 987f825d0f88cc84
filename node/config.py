"""Node configuration: one dataclass, the same names on the command line and in a config file.

Every option of `dledger server` / `dledger cluster` is a field here; the CLI flag is the field
name with dashes (`--heartbeat-interval-ms`), the config file key is the field name with
underscores or dashes, in TOML (`[node]` table or top level) or INI (`[node]` section).
`validate()` returns one message per bad field so a user fixes them all in one go.

Defaults and why (see docs/election.md and docs/replication.md for the full story):
heartbeat 100 ms × leak 4 → a follower notices a dead leader 300–400 ms after it died; the
first vote round doubles as a pre-vote and the survivor with the best log stands at once
(randomized vote timers of 50–450 ms only separate the rest). Measured with
tools/bench/failover.py (docs/performance.md "Failover"); a loaded 2-core machine still never
misses four heartbeats in a row (the elector logs any gap above two intervals).
"""

from __future__ import annotations

import configparser
import dataclasses
import ipaddress
import json
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ipc.peers import PeersError, format_peers, parse_peers  # noqa: F401 - re-exported for the CLI
from node.core.election_types import ElectionConfig
from node.core.membership import MAX_MEMBERS
from node.observe.logfmt import LOG_FORMATS, LOG_LEVELS, configure_logging  # noqa: F401 - re-exported
from node.store.base import (
    DEFAULT_DATA_FILE_SIZE,
    DEFAULT_INDEX_FILE_SIZE,
    FLUSH_MODES,
    StoreConfig,
)
from node.wiring.ports import peers_problems


class ConfigError(ValueError):
    """Invalid configuration; `.problems` lists one message per bad field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass
class NodeConfig:
    id: str = ""
    peers: str = ""
    # A node that is not yet a member (docs/membership.md "Joining"): the group's members as
    # PEERS, and this node's own HOST:PORT. `peers` is then derived: those members plus this
    # node, whose bootstrap configuration does not hold it (it stands for nothing, and waits
    # for a leader's push that makes it a learner).
    join: str = ""
    join_address: str = ""  # `--address` on the command line (as `server --join` is documented)
    group: str = "default"
    store_dir: str = ""
    # election (DLedger: heartBeatTimeIntervalMs, maxHeartBeatLeak, min/maxVoteIntervalMs)
    heartbeat_interval_ms: int = 100
    max_heartbeat_leak: int = 4
    min_vote_interval_ms: int = 50
    max_vote_interval_ms: int = 450
    vote_round_timeout_ms: int = 300
    preferred_leader_ids: str = ""  # comma-separated
    on_role_change: str = ""  # a command run (no shell) on every role change, see docs/operations.md
    transfer_timeout_ms: int = 5_000  # a leadership transfer not done by then fails, the leader resumes
    # client requests and replication
    max_pending_requests: int = 10_000
    max_wait_ack_ms: int = 2_500
    max_push_timeout_ms: int = 1_000
    enable_batch_push: bool = True
    max_batch_push_size: int = 4 << 20  # bytes per push frame
    max_batch_push_interval_ms: int = 10
    max_pending_pushes: int = 1_000
    peer_push_quota: int = 20 << 20  # bytes/s per peer once it is far behind
    peer_push_throttle_point: int = 100_000  # entries not yet pushed that make a peer "far behind"
    max_body_size: int = 4 << 20
    max_frame_size: int = 64 << 20  # ZMQ_MAXMSGSIZE on network-facing sockets
    # Connect to the other nodes from this node's own peers-string host (an IP literal), not
    # from whatever source address the kernel picks: per-address routing or firewall rules can
    # then tell one node's peer traffic from another's (`dledger chaos` partitions use it).
    connect_from_own_host: bool = False
    # security (docs/operations.md "Security"): a key directory makes the data and elector
    # ports CurveZMQ servers admitting only the members' and the listed clients' keys; without
    # one the node runs in plain mode, on loopback addresses only unless `insecure`.
    keys_dir: str = ""
    insecure: bool = False
    # client sessions (exactly-once appends; node/core/sessions.py, docs/client.md)
    max_sessions: int = 10_000  # sessions a leader remembers; the least recently appending go first
    session_window: int = 4_096  # per session, how many of its newest seqs keep their index
    session_scan_entries: int = 100_000  # a new leader rebuilds its sessions from this many newest entries (~0.8 us each)
    # state machine (docs/statemachine.md): "" = none, a plain commit log
    state_machine: str = ""  # "kv" or package.module:Class, applied by the applier role
    state_machine_options: str = ""  # "key=value,key=value": the class's own options
    snapshot_threshold: int = 100_000  # applied entries between two snapshots
    # Linearizable reads without a heartbeat round while the leader's lease holds: assumes
    # bounded clock drift and no election while the leader's heartbeats still reach a quorum
    # (docs/statemachine.md "Lease reads"). Off: every read waits for a confirming round.
    read_lease: bool = False
    max_snapshots_kept: int = 3
    # store
    data_file_size: int = DEFAULT_DATA_FILE_SIZE
    index_file_size: int = DEFAULT_INDEX_FILE_SIZE
    flush_mode: str = "async"
    flush_interval_ms: int = 100
    checkpoint_interval_ms: int = 1_000
    file_reserved_hours: int = 72
    disk_full_ratio: float = 0.90
    disk_space_ratio_to_clean: float = 0.85
    # process management
    role_restart_max_backoff_ms: int = 5_000
    stop_grace_ms: int = 3_000
    run_dir: str = ""  # where ipc:// sockets live; default: a short directory under /tmp
    # logging (every role process reads these from RUN_DIR/config.json)
    log_level: str = "info"
    log_format: str = "text"  # "text" or "json" (one object per line, for log shippers)
    # Prometheus text at http://HOST:PORT/metrics, served by the supervisor (docs/metrics.md)
    metrics_port: int = 0  # 0 = off
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.join and not self.peers and self.id and self.join_address:
            self.peers = f"{self.join};{self.id}-{self.join_address}"

    # ---- derived -------------------------------------------------------------------------
    @property
    def peer_map(self) -> dict[str, tuple[str, int]]:
        return parse_peers(self.peers)

    @property
    def bootstrap_members(self) -> dict[str, tuple[str, int]]:
        """The members of the bootstrap configuration (before any configuration entry): every
        `--peers` member; with `--join`, the members joined, not this node."""
        peers = dict(self.peer_map)  # a copy: a subclass may cache peer_map (the simulator)
        if self.join:
            peers.pop(self.id, None)
        return peers

    @property
    def peer_ids(self) -> list[str]:
        return list(self.peer_map)

    @property
    def self_slot(self) -> int:
        return self.peer_ids.index(self.id)

    @property
    def address(self) -> tuple[str, int]:
        return self.peer_map[self.id]

    def state_machine_option_map(self) -> dict[str, str]:
        """`state_machine_options` ("k=v,k=v") as a dict; StateMachineSpecError if malformed."""
        from node.statemachine.loader import parse_options
        return parse_options(x for x in self.state_machine_options.split(",") if x.strip())

    def election_config(self) -> ElectionConfig:
        return ElectionConfig(
            heartbeat_interval_ms=self.heartbeat_interval_ms, max_heartbeat_leak=self.max_heartbeat_leak,
            min_vote_interval_ms=self.min_vote_interval_ms, max_vote_interval_ms=self.max_vote_interval_ms,
            vote_round_timeout_ms=self.vote_round_timeout_ms)

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            store_dir=self.store_dir, data_file_size=self.data_file_size,
            index_file_size=self.index_file_size, flush_mode=self.flush_mode,
            flush_interval_ms=self.flush_interval_ms, checkpoint_interval_ms=self.checkpoint_interval_ms)

    # ---- validation ----------------------------------------------------------------------
    def validate(self) -> None:
        p: list[str] = []
        peers: dict[str, tuple[str, int]] = {}
        p.extend(self._join_problems())
        if p:
            pass
        elif not self.peers:
            p.append("peers: required (or --join PEERS --address HOST:PORT for a node that is "
                     "not yet a member)")
        else:
            conflicts = peers_problems(self.peers)
            p.extend(f"peers: {m}" for m in conflicts)
            if not conflicts:
                peers = parse_peers(self.peers)
                if len(peers) > MAX_MEMBERS:  # the configuration's limit (docs/membership.md)
                    p.append(f"peers: {len(peers)} members, at most {MAX_MEMBERS}")
        if not self.id:
            p.append("id: required")
        elif peers and self.id not in peers:
            p.append(f"id: {self.id} is not in peers ({', '.join(peers)})")
        if not self.group or len(self.group.encode()) > 64:
            p.append("group: required, at most 64 bytes")
        if not self.store_dir:
            p.append("store_dir: required")
        positive = ("max_pending_requests", "transfer_timeout_ms", "max_wait_ack_ms",
                    "max_push_timeout_ms", "max_batch_push_size", "max_pending_pushes",
                    "peer_push_quota", "peer_push_throttle_point", "max_body_size", "max_frame_size",
                    "flush_interval_ms",
                    "checkpoint_interval_ms", "role_restart_max_backoff_ms", "stop_grace_ms",
                    "max_sessions", "session_window", "session_scan_entries")
        for name in positive:
            if getattr(self, name) <= 0:
                p.append(f"{name}: must be > 0 (got {getattr(self, name)})")
        if self.max_batch_push_interval_ms < 0:
            p.append("max_batch_push_interval_ms: must be >= 0")
        if self.file_reserved_hours < 0:
            p.append("file_reserved_hours: must be >= 0")
        p.extend(self.election_config().problems())
        if self.flush_mode not in FLUSH_MODES:
            p.append(f"flush_mode: must be one of {', '.join(FLUSH_MODES)} (got {_shown(self.flush_mode)})")
        for name in ("disk_full_ratio", "disk_space_ratio_to_clean"):
            if not 0 < getattr(self, name) <= 1:
                p.append(f"{name}: must be in (0, 1]")
        if self.connect_from_own_host and peers and self.id in peers:
            try:
                ipaddress.ip_address(peers[self.id][0])
            except ValueError:
                p.append(f"connect_from_own_host: this node's host {peers[self.id][0]!r} must be an IP address")
        if self.state_machine:
            from node.statemachine.loader import StateMachineSpecError, resolve_state_machine
            try:
                resolve_state_machine(self.state_machine)
                self.state_machine_option_map()
            except StateMachineSpecError as e:
                p.append(f"state_machine: {e}")
        for name in ("snapshot_threshold", "max_snapshots_kept"):
            if getattr(self, name) < 1:
                p.append(f"{name}: must be >= 1")
        for pid in filter(None, self.preferred_leader_ids.split(",")):
            if peers and pid.strip() not in peers:
                p.append(f"preferred_leader_ids: {pid.strip()!r} is not a peer")
        if self.store_dir:
            checked_here = ("flush_mode", "flush_interval_ms", "checkpoint_interval_ms")
            for m in self.store_config().validate():  # "data_file_size must be ..." -> "...: must"
                name, _, rest = m.partition(" ")
                if name not in checked_here:
                    p.append(f"{name}: {rest}" if name in _FIELDS else f"store: {m}")
            if self.max_body_size + 56 > self.data_file_size >= 4096:  # (< 4096: said above)
                p.append("max_body_size: must fit in a data file (data_file_size - 56)")
        if self.log_level not in LOG_LEVELS:
            p.append(f"log_level: must be one of {', '.join(LOG_LEVELS)} (got {_shown(self.log_level)})")
        if self.log_format not in LOG_FORMATS:
            p.append(f"log_format: must be one of {', '.join(LOG_FORMATS)} (got {_shown(self.log_format)})")
        p.extend(_metrics_port_problems(self.metrics_port, peers.get(self.id)))
        p.extend(self.security_problems(peers))
        if p:
            raise ConfigError(p)

    def _join_problems(self) -> list[str]:
        if not self.join:
            return (["join_address: only with --join (a member's address is in --peers)"]
                    if self.join_address else [])
        p = [f"join: {m}" for m in peers_problems(self.join)]
        if not self.join_address:
            p.append("join_address: --address HOST:PORT is required with --join (this node's own)")
        elif not p and self.id:
            try:
                parse_peers(f"{self.id}-{self.join_address}")
            except PeersError as e:
                p.append(f"join_address: {e}")
        if not p and self.id in parse_peers(self.join):
            p.append(f"join: {self.id} is already a member there; a member restarts with --peers")
        if not p and self.peers != f"{self.join};{self.id}-{self.join_address}":
            p.append("peers: give --peers (a member) or --join (a new node), not both")
        return p

    def security_problems(self, peers: dict[str, tuple[str, int]]) -> list[str]:
        """The key directory's problems (all of them), or the plain-mode rule: a node without
        keys binds loopback addresses only, unless told `insecure`."""
        from ipc.security import KeyFileError, is_loopback, load_server_keys

        if self.keys_dir:
            if not peers or self.id not in peers:
                return []
            try:
                load_server_keys(self.keys_dir, self.id, list(peers))
            except KeyFileError as e:
                return e.problems
            return []
        if self.insecure or self.id not in peers:
            return []
        host = peers[self.id][0]
        if not is_loopback(host):
            return [f"keys_dir: none given, and plain mode binds {host} (not loopback): give "
                    "--keys-dir, or --insecure to serve it unauthenticated"]
        return []

    def path_problems(self) -> list[str]:
        """store_dir and run_dir must be (or become) directories this user can write: checked
        before anything starts, so `--store-dir /etc/passwd` is one line, not `[Errno 17]`."""
        out = []
        for name in ("store_dir", "run_dir"):
            value = getattr(self, name)
            problem = _dir_problem(Path(value)) if value else None
            if problem:
                out.append(f"{name}: {problem}")
        return out

    # ---- (de)serialisation ---------------------------------------------------------------
    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d.pop("extra", None)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> NodeConfig:
        return cls(**json.loads(text))


_FIELDS = {f.name: f for f in fields(NodeConfig) if f.name != "extra"}
_DEFAULTS = NodeConfig()

SIZE_FIELDS = frozenset({"data_file_size", "index_file_size", "max_batch_push_size", "peer_push_quota",
                         "max_body_size", "max_frame_size"})
"""Fields given in bytes: they accept units (`64MiB`) on the command line and in a config file."""

LOCAL_DATA_FILE_SIZE = 64 << 20
LOCAL_INDEX_FILE_SIZE = 8 << 20
"""Segment sizes of the groups the tools start on one machine (`dledger cluster`, `make run`,
`bench --local`): a demo should not reserve 3.5 GB of disk for three nodes. `dledger server`
keeps DLedger's 1 GiB / 160 MiB: fewer, larger files for a long-lived log."""

# name -> (one line of help, unit). The unit is shown in --help and docs/operations.md; the
# default is taken from NodeConfig so the help can never disagree with the code.
FIELD_HELP: dict[str, tuple[str, str]] = {
    "id": ("this node's id, one of --peers", "ID"),
    "peers": ("the group, ID-HOST:PORT;... (each node also listens on PORT+1): the same on "
              "every node", "PEERS"),
    "join": ("a new node: the members of the group it joins (it waits to be added with "
             "`dledger member add`, then catches up); instead of --peers", "PEERS"),
    "join_address": ("with --join: this node's own HOST:PORT (and PORT+1); also --address",
                     "HOST:PORT"),
    "group": ("group name; requests naming another group get UNKNOWN_GROUP", "NAME"),
    "store_dir": ("this node's store directory (data/, index/, checkpoint, currterm)", "DIR"),
    "heartbeat_interval_ms": ("leader -> follower heartbeat period", "ms"),
    "max_heartbeat_leak": ("heartbeats missed before a follower stands (or a leader without a "
                           "quorum steps down)", "count"),
    "min_vote_interval_ms": ("lower bound of the randomized vote timer", "ms"),
    "max_vote_interval_ms": ("upper bound of the randomized vote timer", "ms"),
    "vote_round_timeout_ms": ("how long a vote round waits for answers", "ms"),
    "preferred_leader_ids": ("comma-separated ids; a leader not among them hands over to one that "
                             "is alive and caught up", "IDS"),
    "on_role_change": ("command (no shell) run on every role change, DLEDGER_* variables set",
                       "COMMAND"),
    "transfer_timeout_ms": ("a leadership transfer not done by then fails, the leader resumes", "ms"),
    "max_pending_requests": ("appends awaiting a quorum; more get LEADER_PENDING_FULL", "entries"),
    "max_wait_ack_ms": ("an append not committed by then gets WAIT_QUORUM_ACK_TIMEOUT "
                        "(indeterminate)", "ms"),
    "max_push_timeout_ms": ("an unanswered push is resent from the follower's watermark", "ms"),
    "enable_batch_push": ("push many entries per frame", "true|false"),
    "max_batch_push_size": ("largest push frame", "bytes"),
    "max_batch_push_interval_ms": ("reserved: pushes go out as soon as entries exist", "ms"),
    "max_pending_pushes": ("pushes in flight per follower (also its out-of-order queue)", "pushes"),
    "peer_push_quota": ("rate to a follower that is far behind", "bytes/s"),
    "peer_push_throttle_point": ("entries not yet pushed that make a follower far behind", "entries"),
    "max_body_size": ("largest body accepted (larger: UNEXPECTED_ARGUMENT)", "bytes"),
    "max_frame_size": ("ZMQ_MAXMSGSIZE of network sockets (larger frames drop the connection)",
                       "bytes"),
    "keys_dir": ("CurveZMQ keys: ID.key per member, this node's ID.key_secret, clients/NAME.key "
                 "and clients/rights (docs/operations.md \"Security\"); empty: plain mode", "DIR"),
    "insecure": ("allow plain mode (no keys_dir) on a non-loopback address", "true|false"),
    "connect_from_own_host": ("connect to peers from this node's own peers-string host (an IP)",
                              "true|false"),
    "max_sessions": ("client sessions a leader remembers (least recently appending go first)",
                     "sessions"),
    "session_window": ("per session, how many of its newest seqs keep their index", "seqs"),
    "session_scan_entries": ("newest entries a new leader scans to rebuild its sessions", "entries"),
    "state_machine": ('applied to the committed log: "kv" or package.module:Class; empty: a '
                      "plain log", "NAME"),
    "state_machine_options": ("the state machine's own options", "key=value,..."),
    "snapshot_threshold": ("applied entries between two snapshots", "entries"),
    "read_lease": ("serve linearizable reads within the leader's lease, without a heartbeat round "
                   "(assumes bounded clock drift: docs/statemachine.md)", "true|false"),
    "max_snapshots_kept": ("snapshots kept on disk", "snapshots"),
    "data_file_size": ("data segment file size, fixed once the store exists", "bytes"),
    "index_file_size": ("index segment file size (multiple of 32), fixed once the store exists",
                        "bytes"),
    "flush_mode": ("async: flushed every flush-interval-ms; sync: durable before the ack",
                   "async|sync"),
    "flush_interval_ms": ("async flush period", "ms"),
    "checkpoint_interval_ms": ("how often committed and end index are checkpointed", "ms"),
    "file_reserved_hours": ("retention keeps a data file written less than this long ago "
                            "(below disk-full-ratio)", "hours"),
    "disk_full_ratio": ("disk usage at which appends get DISK_FULL and retention forces",
                        "ratio 0-1"),
    "disk_space_ratio_to_clean": ("disk usage above which retention deletes old committed files",
                                  "ratio 0-1"),
    "role_restart_max_backoff_ms": ("cap of the backoff before a dead role is restarted", "ms"),
    "stop_grace_ms": ("SIGTERM -> SIGKILL grace for the roles at stop", "ms"),
    "run_dir": ("ipc:// sockets, doorbells (named pipes) and config.json (path < 100 bytes); empty: /tmp/dl-ID-*, "
                "reclaimed by the next start if the node was killed", "DIR"),
    "log_level": ("least important log level shown (--debug: debug)", "|".join(LOG_LEVELS)),
    "log_format": ("text, or json: one object per line; timestamps ISO 8601 with offset",
                   "|".join(LOG_FORMATS)),
}
FIELD_HELP["metrics_port"] = ("serve Prometheus metrics at http://HOST:PORT/metrics (HOST: this "
                               "node's peers host); 0: off", "port")
REQUIRED = ("id", "peers", "store_dir")


def _metrics_port_problems(port: int, address: tuple[str, int] | None) -> list[str]:
    """A metrics port is a TCP port not used by this node's data or elector port."""
    if not 0 <= port <= 65535:
        return [f"metrics_port: must be 0 (off) or a TCP port 1-65535 (got {port})"]
    if port and address is not None and port in (address[1], address[1] + 1):
        return [f"metrics_port: {port} is this node's {'data' if port == address[1] else 'elector'} port"]
    return []

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mib": 1 << 20,
               "mb": 1000**2, "g": 1 << 30, "gib": 1 << 30, "gb": 1000**3, "t": 1 << 40,
               "tib": 1 << 40, "tb": 1000**4}
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_size(text: str | int) -> int:
    """Bytes from `64MiB`, `1GiB`, `512KiB`, `1.5g`, `4096` (K/M/G/T and KiB/MiB/GiB/TiB are
    powers of 1024, KB/MB/GB/TB of 1000). The one parser of sizes, used by the command line
    and the config file alike, so a value means the same wherever it is written."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE_RE.fullmatch(str(text).strip().replace("_", "").lower())
    if m is None or m.group(2) not in _SIZE_UNITS:
        raise ValueError(f'expected a size such as 64MiB, 1GiB, 512KiB or bytes, got "{text}"')
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if value != int(value):
        raise ValueError(f'"{text}" is not a whole number of bytes')
    return int(value)


def format_size(n: int) -> str:
    """`1GiB`, `160MiB`, `4096` bytes: the largest binary unit that divides `n` exactly."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _shown(value: Any) -> str:
    """A config value as a user wrote it (never a Python repr: `a list`, `"abc"`, `3`)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    names = {list: "a list", dict: "a table", tuple: "a list"}
    return names.get(type(value), f"a {type(value).__name__}")


def _coerce(name: str, value: Any) -> Any:
    """`value` (a command-line string, or a TOML/INI value) as the field's type; ValueError
    with one line naming the field otherwise. TOML values must already have the right type
    (a list for `peers` is an error, not `str(list)`); strings are parsed as on the CLI."""
    kind = type(getattr(_DEFAULTS, name))
    is_num = isinstance(value, int | float) and not isinstance(value, bool)
    try:
        if name in SIZE_FIELDS and (isinstance(value, str) or (is_num and isinstance(value, int))):
            return parse_size(value)
        if kind is str and isinstance(value, str):
            return value.strip().lower() if name in ("log_level", "log_format") else value.strip()
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
                return False
        if kind is int:
            if is_num and isinstance(value, int):
                return value
            if isinstance(value, str):
                return int(value.strip().replace("_", ""))
        if kind is float:
            if is_num:
                return float(value)
            if isinstance(value, str):
                v = float(value.strip())
                if v == v and abs(v) != float("inf"):
                    return v
    except ValueError as e:
        if name in SIZE_FIELDS:
            raise ValueError(f"{name}: {e}") from None
    want = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}[kind]
    if name in SIZE_FIELDS:
        want = "a size such as 64MiB or a number of bytes"
    raise ValueError(f"{name}: expected {want}, got {_shown(value)}")


_INI_SUFFIXES = (".ini", ".cfg", ".conf")


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """TOML (`.toml`) or INI (`.ini`, `.cfg`, `.conf`): a `[node]` table/section, or top-level
    keys. Any other suffix is refused rather than guessed at (a YAML file read as INI gave
    nonsense). Unknown keys are reported by build_config."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ConfigError([f"config: cannot read {p}: it is a directory, not a file"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"config: {p} is not UTF-8 text"]) from None
    except OSError as e:
        raise ConfigError([f"config: cannot read {p}: {e.strerror or e}"]) from None
    if p.suffix.lower() not in (".toml", *_INI_SUFFIXES):
        raise ConfigError([f"config: {p}: unsupported format {p.suffix or '(no suffix)'}: "
                           "use a .toml or .ini file"])
    raw: dict[str, Any]
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
            node = data.get("node", data)
            if not isinstance(node, dict):
                raise ConfigError([f"config: {p}: [node] must be a table"])
            raw = node if "node" in data else data
        else:
            cp = configparser.ConfigParser(interpolation=None)
            cp.read_string(text if text.lstrip().startswith("[") else "[node]\n" + text)
            if not cp.has_section("node"):
                raise ConfigError([f"config: {p}: no [node] section"])
            raw = dict(cp["node"])
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"config: {p}: not valid TOML: {e}"]) from None
    except configparser.Error as e:
        first = " ".join(str(e).split())
        raise ConfigError([f"config: {p}: not valid INI: {first}"]) from None
    return {k.replace("-", "_"): v for k, v in raw.items()}


def merge_values(*sources: tuple[str, dict[str, Any]]
                 ) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Later sources win: (values, where each came from, one problem per bad value)."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for label, source in sources:
        for k, v in source.items():
            if v is None:
                continue
            if k not in _FIELDS:
                problems.append(f"{k}: unknown option")
                continue
            try:
                values[k] = _coerce(k, v)
                origin[k] = label
            except ValueError as e:
                problems.append(str(e))
    return values, origin, problems


def build_config(file_values: dict[str, Any], cli_values: dict[str, Any],
                 check_paths: bool = True) -> NodeConfig:
    """File values first, then command-line values on top; every problem reported at once."""
    return build_config_with_sources(file_values, cli_values, check_paths=check_paths)[0]


def build_config_with_sources(file_values: dict[str, Any], cli_values: dict[str, Any],
                              base: dict[str, Any] | None = None, check_paths: bool = True,
                              ) -> tuple[NodeConfig, dict[str, str]]:
    """build_config, also saying where each field's value came from: `default`, `tool default`
    (`base`: a tool's own defaults such as `dledger cluster`'s small files), `file` or `flag`."""
    values, origin, problems = merge_values(("tool default", base or {}), ("file", file_values),
                                            ("flag", cli_values))
    bad = {m.partition(":")[0] for m in problems}
    cfg = NodeConfig(**values)
    try:
        cfg.validate()
    except ConfigError as e:  # all at once; not again for a field whose value was unusable
        problems += [m for m in e.problems if m.partition(":")[0] not in bad]
    if check_paths:
        problems += cfg.path_problems()
    if problems:
        raise ConfigError(problems)
    return cfg, {name: origin.get(name, "default") for name in _FIELDS}


def adopt_store_file_sizes(cfg: NodeConfig, sources: dict[str, str]
                           ) -> tuple[NodeConfig, dict[str, str], list[str]]:
    """A store keeps the segment file sizes it was created with. Where the configuration did not
    choose a size (its default), take the store's (source "store"); where it chose another one,
    say so as a problem: the node could not map its files, and the user must decide."""
    from node.store.layout import existing_file_sizes

    found = existing_file_sizes(cfg.store_dir, {"data_file_size": cfg.data_file_size,
                                                 "index_file_size": cfg.index_file_size})
    changes: dict[str, int] = {}
    problems: list[str] = []
    for name, size in found.items():
        if getattr(cfg, name) == size:
            continue
        if sources.get(name, "default") in ("default", "tool default"):
            changes[name] = size
        else:
            problems.append(f"{name}: {getattr(cfg, name)} ({sources[name]}), but the store at "
                            f"{cfg.store_dir} was created with {size}-byte files and a store's file "
                            "sizes cannot change; give the store's size or leave the option out")
    if changes:
        cfg = dataclasses.replace(cfg, **changes)
        sources = {**sources, **dict.fromkeys(changes, "store")}
        try:
            cfg.validate()  # e.g. max_body_size must still fit in the store's data files
        except ConfigError as e:
            problems += [f"{m} (the store's files are {found.get('data_file_size', cfg.data_file_size)} bytes)"
                         for m in e.problems]
    return cfg, sources, problems


def _dir_problem(path: Path) -> str | None:
    """Why `path` cannot be (or become) a directory this process writes, or None."""
    try:
        if path.exists():
            if not path.is_dir():
                return f"{path} exists and is not a directory"
            if not os.access(path, os.W_OK | os.X_OK):
                return f"{path} is not writable"
            return None
        for parent in path.absolute().parents:
            if parent.exists():
                if not parent.is_dir():
                    return f"cannot create {path}: {parent} is not a directory"
                if not os.access(parent, os.W_OK | os.X_OK):
                    return f"cannot create {path}: {parent} is not writable"
                return None
    except OSError as e:
        return f"cannot check {path}: {e.strerror or e}"
    return None


_CHOICE_FIELDS = ("flush_mode", "log_level", "log_format")  # argparse's metavar lists the choices


def help_text(name: str, default: Any = None) -> str:
    """The one line of `--help` for field `name`: what it does, its unit and its default (the
    node's, or `default`: a tool's own, such as `dledger cluster`'s small files)."""
    text, unit = FIELD_HELP[name]
    if default is None:
        default = getattr(_DEFAULTS, name)
    if name in REQUIRED:
        return f"{text} (required)"
    if name in SIZE_FIELDS:
        shown = format_size(default)
    elif isinstance(default, bool):
        shown = "true" if default else "false"
    else:
        shown = str(default) if default != "" else "none"
    unit_note = f" [{unit}]" if (unit.islower() or "|" in unit) and name not in _CHOICE_FIELDS else ""
    return f"{text}{unit_note} (default: {shown})"


_METAVARS = {"ms": "MS", "bytes": "SIZE", "bytes/s": "SIZE", "hours": "HOURS", "ratio 0-1": "RATIO",
             "true|false": "BOOL"}


def add_node_arguments(parser: Any, skip: tuple[str, ...] = (),
                       defaults: dict[str, Any] | None = None) -> None:
    """Add one `--flag` per NodeConfig field (default None = "not given", so a config file's
    value is not overridden by an argparse default; the real default is in the help line, or
    the tool's own from `defaults`)."""
    for name in _FIELDS:
        if name in skip:
            continue
        unit = FIELD_HELP[name][1]
        metavar = _METAVARS.get(unit) or (unit if unit.isupper() else unit.split()[0].upper())
        if "|" in unit:
            metavar = "{" + unit.replace("|", ",") + "}" if name.startswith("log_") or name == "flush_mode" else "BOOL"
        # A true/false option given alone means true (`--insecure`, as the docs write it);
        # `--insecure false` still says it in full.
        bare = {"nargs": "?", "const": "true"} if metavar == "BOOL" else {}
        flags = ["--" + name.replace("_", "-")] + (["--address"] if name == "join_address" else [])
        parser.add_argument(*flags, dest=name, default=None, metavar=metavar,
                            help=help_text(name, (defaults or {}).get(name)), **bare)


def cli_values(args: Any) -> dict[str, Any]:
    return {k: getattr(args, k) for k in _FIELDS if getattr(args, k, None) is not None}


# ---- printing the effective configuration ---------------------------------------------------
def _toml_value(name: str, value: Any) -> str:
    if name in SIZE_FIELDS:
        return json.dumps(format_size(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def render_config(cfg: NodeConfig, sources: dict[str, str], fmt: str = "toml") -> str:
    """The effective configuration, loadable again with `--config`: TOML (a `[node]` table, each
    line commented with where its value came from) or JSON (`{"node": {...}, "source": {...}}`)."""
    values = {name: getattr(cfg, name) for name in _FIELDS}
    if fmt == "json":
        return json.dumps({"node": values, "source": sources}, indent=2)
    width = max(len(f"{k} = {_toml_value(k, v)}") for k, v in values.items())
    lines = ["# dledger server: effective configuration (TOML; load it with --config FILE)",
             "# each value's source: default, tool default, file (--config) or flag", "[node]"]
    lines += [f"{f'{k} = {_toml_value(k, v)}':<{width}}  # {sources.get(k, 'default')}"
              for k, v in values.items()]
    return "\n".join(lines)
