"""Node configuration: one dataclass, the same names on the command line and in a config file.

Every option of `dledger server` / `dledger cluster` is a field here; the CLI flag is the field
name with dashes (`--heartbeat-interval-ms`), the config file key is the field name with
underscores or dashes, in TOML (`[node]` table or top level) or INI (`[node]` section).
`validate()` returns one message per bad field so a user fixes them all in one go.

Defaults and why (see docs/election.md and docs/replication.md for the full story):
heartbeat 100 ms × leak 4 → a follower notices a dead leader 300–400 ms after it died; the
first vote round doubles as a pre-vote and the survivor with the best log stands at once
(randomized vote timers of 50–450 ms only separate the rest). Measured with
tools/bench_failover.py (docs/performance.md "Failover"); a loaded 2-core machine still never
misses four heartbeats in a row (the elector logs any gap above two intervals).
"""

from __future__ import annotations

import configparser
import dataclasses
import ipaddress
import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ipc.sockets import format_peers, parse_peers  # noqa: F401 - re-exported for the CLI
from node.core.election_types import ElectionConfig
from node.store.base import (
    DEFAULT_DATA_FILE_SIZE,
    DEFAULT_INDEX_FILE_SIZE,
    FLUSH_MODES,
    StoreConfig,
)


class ConfigError(ValueError):
    """Invalid configuration; `.problems` lists one message per bad field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass
class NodeConfig:
    id: str = ""
    peers: str = ""
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
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    # ---- derived -------------------------------------------------------------------------
    @property
    def peer_map(self) -> dict[str, tuple[str, int]]:
        return parse_peers(self.peers)

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
        try:
            peers = parse_peers(self.peers)
        except ValueError as e:
            p.append(f"peers: {e}")
        if not self.id:
            p.append("id: required")
        elif peers and self.id not in peers:
            p.append(f"id: {self.id!r} is not in peers ({', '.join(peers)})")
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
            p.append(f"flush_mode: must be one of {', '.join(FLUSH_MODES)} (got {self.flush_mode!r})")
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
            p.extend(f"store: {m}" for m in self.store_config().validate())
            if self.max_body_size + 56 > self.data_file_size:
                p.append("max_body_size: must fit in a data file (data_file_size - 56)")
        if p:
            raise ConfigError(p)

    # ---- (de)serialisation ---------------------------------------------------------------
    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d.pop("extra", None)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> NodeConfig:
        return cls(**json.loads(text))


_FIELDS = {f.name: f for f in fields(NodeConfig) if f.name != "extra"}


def _coerce(name: str, value: Any) -> Any:
    kind = type(getattr(NodeConfig(), name))
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    text = str(value).strip()
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text.replace("_", ""))
        if kind is float:
            return float(text)
        return text
    except ValueError:
        raise ValueError(f"{name}: expected {kind.__name__}, got {value!r}") from None


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """TOML (`.toml`) or INI: a `[node]` table/section, or top-level keys. Unknown keys → error."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"config: cannot read {p}: {e.strerror}"]) from None
    raw: dict[str, Any]
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
            raw = data.get("node", data)
        else:
            cp = configparser.ConfigParser()
            cp.read_string(text if text.lstrip().startswith("[") else "[node]\n" + text)
            raw = dict(cp["node"]) if cp.has_section("node") else {}
    except (tomllib.TOMLDecodeError, configparser.Error) as e:
        raise ConfigError([f"config: {p}: {e}"]) from None
    return {k.replace("-", "_"): v for k, v in raw.items()}


def build_config(file_values: dict[str, Any], cli_values: dict[str, Any]) -> NodeConfig:
    """File values first, then command-line values on top; every problem reported at once."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    for source in (file_values, cli_values):
        for k, v in source.items():
            if v is None:
                continue
            if k not in _FIELDS:
                problems.append(f"{k}: unknown option")
                continue
            try:
                values[k] = _coerce(k, v)
            except ValueError as e:
                problems.append(str(e))
    if problems:
        raise ConfigError(problems)
    cfg = NodeConfig(**values)
    cfg.validate()
    return cfg


def add_node_arguments(parser: Any, skip: tuple[str, ...] = ()) -> None:
    """Add one `--flag` per NodeConfig field (default None = "not given", so a config file's
    value is not overridden by an argparse default)."""
    for name in _FIELDS:
        if name in skip:
            continue
        kind = type(getattr(NodeConfig(), name))
        flag = "--" + name.replace("_", "-")
        default = getattr(NodeConfig(), name)
        parser.add_argument(flag, dest=name, default=None, metavar=kind.__name__.upper(),
                            help=f"(default: {default!r})" if default != "" else None)


def cli_values(args: Any) -> dict[str, Any]:
    return {k: getattr(args, k) for k in _FIELDS if getattr(args, k, None) is not None}
