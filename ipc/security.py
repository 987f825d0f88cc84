"""CurveZMQ keys, the ZAP handler and rights: who may speak on a node's public ports.

Why here, beside `ipc.sockets`: servers (handler, elector) and clients (DLedgerClient, the CLI
tools) read the same key files and set the same socket options, so the rules live once.

Model (docs/operations.md "Security"):

- Every member and every client has a CurveZMQ key pair (`dledger keygen`): ``NAME.key`` holds
  the public key, ``NAME.key_secret`` (mode 0600) the pair.
- A node's key directory (`keys_dir`) holds ``ID.key`` of every member, this node's
  ``ID.key_secret``, and ``clients/NAME.key`` for each client with its rights in
  ``clients/rights`` (``NAME read|write|admin`` per line). ``ID.prev.key`` is also accepted as
  member ID while its key is rotated.
- The data and elector ports are CURVE servers with the node's own key; ZAP (one
  `ThreadAuthenticator` per role process that binds one) admits a connection only for a known
  key and sets its User-Id: ``member:ID`` or ``client:NAME:RIGHT``. The elector port admits
  members only. Every frame is then checked against that User-Id (`authorize`): a member may
  only speak as itself, a client only within its right.
- A client connects with its own pair and the member's public key (``ID.key`` in the directory
  of its key file, or given): the CURVE handshake proves both ends, encrypts the traffic, and
  refuses a replayed handshake (fresh short-term keys per connection).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from zmq.utils import z85

RIGHTS = ("read", "write", "admin")
"""Each right includes the ones before it: `write` may read, `admin` may write."""
KEY_FILE_ENV = "DLEDGER_KEY_FILE"
"""A client secret key file the CLI uses when --key-file is not given."""
DATA_DOMAIN = "data"
ELECTOR_DOMAIN = "elector"
MEMBER = "member"
CLIENT = "client"


class KeyFileError(ValueError):
    """A key file or key directory that cannot be used; one line per problem in `.problems`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# ---- key files --------------------------------------------------------------------------------
_BANNER = "#   ****  DLedger CurveZMQ {what} (dledger keygen)  ****\n#   {note}\n\n"


def _key_text(public: bytes, secret: bytes | None, name: str) -> str:
    note = ("ZeroMQ certificate format; keep it secret (mode 0600)" if secret
            else "ZeroMQ certificate format; public: copy it to the nodes / clients that trust it")
    out = [_BANNER.format(what="secret key" if secret else "public key", note=note),
           "metadata\n", f'    name = "{name}"\n', "curve\n",
           f'    public-key = "{public.decode()}"\n']
    if secret:
        out.append(f'    secret-key = "{secret.decode()}"\n')
    return "".join(out)


def keygen(out_dir: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write a new pair: ``NAME.key`` (0644) and ``NAME.key_secret`` (0600, created with that
    mode, never readable by others even for an instant). Refuses to overwrite either file: a
    replaced key locks its holder out, so that must be a deliberate `rm`."""
    if not name or "/" in name or name.startswith(".") or name in ("clients", "rights"):
        raise KeyFileError([f"key name {name!r}: must be a plain file name"])
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    pub_path, sec_path = d / f"{name}.key", d / f"{name}.key_secret"
    for p in (pub_path, sec_path):
        if p.exists():
            raise KeyFileError([f"{p}: exists; remove it first to replace the key"])
    fd = os.open(sec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(_key_text(public, secret, name))
    fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(_key_text(public, None, name))
    return pub_path, sec_path


def _key_value(raw: bytes, what: str, path: Path) -> bytes:
    value = raw.split(b"=", 1)[1].strip(b" \t'\"")
    try:
        ok = len(z85.decode(value)) == 32
    except Exception:  # z85 raises ValueError / KeyError / IndexError on junk
        ok = False
    if not ok:
        raise KeyFileError([f"{path}: {what} is not a 40-character Z85 CurveZMQ key"])
    return value


def read_key_file(path: str | os.PathLike[str]) -> tuple[bytes, bytes | None]:
    """(public, secret or None) in Z85 from a key file; KeyFileError (one line) when the file is
    missing, unreadable, has no public key or a malformed key."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise KeyFileError([f"{p}: cannot read key file ({e.strerror or e})"]) from None
    public = secret = None
    for line in data.splitlines():
        line = line.strip()
        if line.startswith(b"public-key") and b"=" in line:
            public = _key_value(line, "public-key", p)
        elif line.startswith(b"secret-key") and b"=" in line:
            secret = _key_value(line, "secret-key", p)
    if public is None:
        raise KeyFileError([f"{p}: no public-key line (not a `dledger keygen` key file)"])
    if secret is not None and zmq.curve_public(secret) != public:
        raise KeyFileError([f"{p}: secret-key does not match public-key"])
    return public, secret


def read_secret_key_file(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file; refuses a public-only file and a secret
    file that others can read (an operator mistake worth stopping for, as ssh does)."""
    public, secret = read_key_file(path)
    if secret is None:
        raise KeyFileError([f"{path}: holds no secret-key (give the NAME.key_secret file)"])
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise KeyFileError([f"{path}: mode {mode:o} lets others read a secret key (chmod 600)"])
    return public, secret


# ---- a node's keys ------------------------------------------------------------------------------
@dataclass
class ServerKeys:
    """What a node needs to run its public ports securely (all keys Z85)."""

    self_id: str
    public: bytes
    secret: bytes
    member_public: dict[str, bytes]  # id -> the key others use to reach it as a server
    member_keys: dict[bytes, str] = field(default_factory=dict)  # accepted key -> member id
    client_keys: dict[bytes, tuple[str, str]] = field(default_factory=dict)  # key -> (name, right)


def client_key_file(given: str | None, given_as: str) -> str | None:
    """The client's secret key file: `given` (named `given_as` in errors: "--key-file", "option
    keyFile"), else $DLEDGER_KEY_FILE, else None (plain mode). Read here, once, so that a bad
    file is one error where it is named, before anything connects; the CLI and the Spark
    source both take their key this way. Raises KeyFileError naming the path's source."""
    path, source = (given or "").strip(), given_as
    if not path:
        path, source = os.environ.get(KEY_FILE_ENV, "").strip(), f"${KEY_FILE_ENV}"
    if not path:
        return None
    try:
        read_secret_key_file(path)
    except KeyFileError as e:
        raise KeyFileError([f"{source}: {e}"]) from None
    return os.path.abspath(path)


def load_server_keys(keys_dir: str | os.PathLike[str], self_id: str,
                     member_ids: list[str]) -> ServerKeys:
    """Read a node's key directory (layout in the module docstring); every problem found is
    reported, one line each, so an operator fixes them in one go."""
    d = Path(keys_dir)
    problems: list[str] = []
    if not d.is_dir():
        raise KeyFileError([f"keys_dir: {d} is not a directory"])
    member_public: dict[str, bytes] = {}
    member_keys: dict[bytes, str] = {}
    for mid in member_ids:
        for suffix in (".key", ".prev.key"):
            p = d / f"{mid}{suffix}"
            if suffix == ".prev.key" and not p.exists():
                continue
            try:
                pub, _ = read_key_file(p)
            except KeyFileError as e:
                problems.extend(f"keys_dir: {m}" for m in e.problems)
                continue
            if pub in member_keys and member_keys[pub] != mid:
                problems.append(f"keys_dir: {p}: the same key as member {member_keys[pub]}")
            member_keys[pub] = mid
            if suffix == ".key":
                member_public[mid] = pub
    public = secret = b""
    try:
        public, secret = read_secret_key_file(d / f"{self_id}.key_secret")
        if member_public.get(self_id) not in (None, public):
            problems.append(f"keys_dir: {d / (self_id + '.key_secret')} does not match "
                            f"{d / (self_id + '.key')}")
    except KeyFileError as e:
        problems.extend(f"keys_dir: {m}" for m in e.problems)
    clients: dict[bytes, tuple[str, str]] = {}
    cdir = d / "clients"
    if cdir.is_dir():
        rights = _read_rights(cdir / "rights", problems)
        for p in sorted(cdir.glob("*.key")):
            name = p.name[:-len(".key")]
            try:
                pub, _ = read_key_file(p)
            except KeyFileError as e:
                problems.extend(f"keys_dir: {m}" for m in e.problems)
                continue
            right = rights.get(name)
            if right is None:
                problems.append(f"keys_dir: client {name!r} ({p}) has no line in {cdir / 'rights'}")
            elif pub in member_keys:
                problems.append(f"keys_dir: client {name!r} uses member {member_keys[pub]}'s key")
            else:
                clients[pub] = (name, right)
        for name in rights:
            if not (cdir / f"{name}.key").exists():
                problems.append(f"keys_dir: {cdir / 'rights'} names {name!r} but {name}.key is missing")
    if problems:
        raise KeyFileError(problems)
    return ServerKeys(self_id, public, secret, member_public, member_keys, clients)


def _read_rights(path: Path, problems: list[str]) -> dict[str, str]:
    """``NAME RIGHT`` per line (``#`` comments); RIGHT one of RIGHTS."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        problems.append(f"keys_dir: {path}: cannot read ({e})")
        return out
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or parts[1] not in RIGHTS:
            problems.append(f"keys_dir: {path}:{n}: expected 'NAME {'|'.join(RIGHTS)}', got {line!r}")
            continue
        out[parts[0]] = parts[1]
    return out


# ---- plain mode -------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address (127/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


# ---- ZAP: who is at the other end --------------------------------------------------------------
class _Callbacks:
    """The authenticator's key check, per ZAP domain; counts what it refuses."""

    def __init__(self, keys: ServerKeys,
                 more_members: Callable[[], Mapping[bytes, str]] | None = None) -> None:
        self.keys = keys
        self.refused = 0
        self._lock = threading.Lock()
        self._more_members = more_members

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key in self.keys.member_keys or (domain == DATA_DOMAIN and key in self.keys.client_keys)
        if not ok and self._more_members is not None:
            # A member added after this process read its keys: the configuration names its
            # key (the node's slot table). Admitted as that member from now on.
            mid = self._more_members().get(key)
            if mid is not None:
                self.keys.member_keys[key] = mid
                self.keys.member_public.setdefault(mid, key)
                ok = True
        if not ok:
            with self._lock:
                self.refused += 1
        return ok


def user_id_of(keys: ServerKeys, key_z85: bytes) -> str:
    """The ZAP User-Id of an admitted key: ``member:ID`` or ``client:NAME:RIGHT``."""
    mid = keys.member_keys.get(key_z85)
    if mid is not None:
        return f"{MEMBER}:{mid}"
    name, right = keys.client_keys[key_z85]
    return f"{CLIENT}:{name}:{right}"


class Zap:
    """The ZAP handler of one role process (a CURVE server socket needs one in its context).

    `refused` counts handshakes refused for an unknown key (the role adds it to its metrics)."""

    def __init__(self, ctx: zmq.Context, keys: ServerKeys,
                 more_members: Callable[[], Mapping[bytes, str]] | None = None) -> None:
        """`more_members`: {key: member id} of members added since `keys` was read, asked (in
        the authenticator's thread) for a key `keys` does not know."""
        from zmq.auth.thread import ThreadAuthenticator

        self.keys = keys
        self._cb = _Callbacks(keys, more_members)
        keys_ = keys

        class _Auth(ThreadAuthenticator):
            def curve_user_id(self, client_public_key: bytes) -> str:
                return user_id_of(keys_, z85.encode(client_public_key))

        self.auth = _Auth(ctx)
        self.auth.start()
        for domain in (DATA_DOMAIN, ELECTOR_DOMAIN):
            self.auth.configure_curve_callback(domain, self._cb)

    @property
    def refused(self) -> int:
        return self._cb.refused

    def stop(self) -> None:
        self.auth.stop()


def curve_server(sock: zmq.Socket, keys: ServerKeys, domain: str) -> None:
    """Make `sock` (before bind) a CURVE server with this node's key in ZAP `domain`."""
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SERVER, 1)


@dataclass(frozen=True)
class ClientCurve:
    """A CURVE client identity (a member's or a client's pair) and the servers' public keys."""

    public: bytes
    secret: bytes
    server_keys: Mapping[str, bytes]  # member id -> its public key
    # Where the members' ``ID.key`` files are: a member added after this identity was made
    # (its key file copied there since) is looked up again when first needed.
    key_dir: Path | None = None

    def apply(self, sock: zmq.Socket, member_id: str) -> None:
        """Make `sock` (before connect) a CURVE client of member `member_id`."""
        server = self.server_keys.get(member_id)
        if server is None and self.key_dir is not None and isinstance(self.server_keys, dict):
            try:
                server, _ = read_key_file(self.key_dir / f"{member_id}.key")
                self.server_keys[member_id] = server
            except KeyFileError:
                server = None
        if server is None:
            raise KeyFileError([f"no public key for member {member_id!r} (expected {member_id}.key "
                                "beside the key file)"])
        sock.setsockopt(zmq.CURVE_SERVERKEY, server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)


def member_curve(keys: ServerKeys) -> ClientCurve:
    """How this node connects to the other members: as itself, to their keys."""
    return ClientCurve(keys.public, keys.secret, dict(keys.member_public))


def client_curve(key_file: str | os.PathLike[str],
                 server_keys: Mapping[str, bytes] | str | os.PathLike[str] | None = None) -> ClientCurve:
    """A client's CURVE identity from its ``.key_secret`` file. The members' public keys are
    ``ID.key`` files in `server_keys` (a directory; default: the key file's directory, as
    `dledger cluster` lays them out) or a ready {id: key} mapping."""
    public, secret = read_secret_key_file(key_file)
    if isinstance(server_keys, Mapping):
        return ClientCurve(public, secret, dict(server_keys))
    d = Path(server_keys) if server_keys is not None else Path(key_file).parent
    found: dict[str, bytes] = {}
    for p in sorted(d.glob("*.key")):
        if p.name.endswith(".prev.key"):
            continue
        try:
            pub, _ = read_key_file(p)
        except KeyFileError:
            continue  # not a member key; a missing member key is reported when it is needed
        found[p.name[:-len(".key")]] = pub
    return ClientCurve(public, secret, found, d)


# ---- rights -------------------------------------------------------------------------------------
def _level(right: str) -> int:
    return RIGHTS.index(right)


def parse_user_id(user_id: str | None) -> tuple[str, str, str] | None:
    """(kind, name, right) from a ZAP User-Id; None for a plain connection (no ZAP)."""
    if not user_id:
        return None
    kind, _, rest = user_id.partition(":")
    if kind == MEMBER:
        return MEMBER, rest, "admin"
    name, _, right = rest.rpartition(":")
    return CLIENT, name, right


_MEMBER_ONLY = frozenset({"PushRequest", "InstallRequest", "VoteRequest", "HeartbeatRequest",
                          "TakeLeadershipRequest", "ReadIndexRequest"})
"""Raft traffic between members: never from a client key, whatever its right."""
_CLAIMS_SENDER = frozenset({"PushRequest", "InstallRequest", "VoteRequest", "HeartbeatRequest",
                            "TakeLeadershipRequest"})
"""Requests whose `leader_id` names the member sending them: it must be the key's member."""
_NEEDS = {"GetRequest": "read", "FetchRequest": "read", "QueryRequest": "read",
          "MetadataRequest": "read", "AppendRequest": "write", "BatchAppendRequest": "write",
          "OpenSessionRequest": "write", "LeadershipTransferRequest": "admin",
          "SnapshotRequest": "admin", "MemberChangeRequest": "admin"}
"""The right each client request needs; a request type not named here needs `admin` (a new
kind of request is closed to read and write keys until someone decides otherwise)."""


def authorize(principal: tuple[str, str, str] | None, msg: object) -> str | None:
    """None if `principal` (from `parse_user_id`) may send request `msg`, else the one-line
    reason it may not. A plain connection (None) may send anything: plain mode trusts the
    network (loopback only unless --insecure)."""
    if principal is None:
        return None
    kind, name, right = principal
    t = type(msg).__name__
    if kind == MEMBER:
        if t in _CLAIMS_SENDER and getattr(msg, "leader_id", None) != name:
            return f"member {name} cannot speak for {getattr(msg, 'leader_id', '')!r}"
        return None
    if t in _MEMBER_ONLY:
        return f"client {name!r}: {t[:-len('Request')]} is for members only"
    need = _NEEDS.get(t, "admin")
    if right not in RIGHTS or _level(right) < _level(need):
        return f"client {name!r} has right {right!r}; {t[:-len('Request')]} needs {need!r}"
    return None


def recv_routed_user(sock: zmq.Socket, flags: int = 0) -> tuple[bytes, bytes, str | None] | None:
    """Like `ipc.sockets.recv_routed`, plus the ZAP User-Id of the frame's connection (None on a
    plain socket). Why per frame: libzmq stamps User-Id on each message, so a router serving
    many connections learns who sent each one without a table of its own."""
    parts = sock.recv_multipart(flags, copy=False)
    if len(parts) != 2:
        return None
    frame = parts[1]
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:
        user = None
    return parts[0].bytes, frame.bytes, user or None


def local_group_keys(d: str | os.PathLike[str], member_ids: list[str], client: str = "admin") -> Path:
    """Keys for a local group (`dledger cluster`, `make run`): one pair per member and an
    `admin` client, laid out as a node's key directory; the client's secret key file (beside
    the members' public keys, so a client finds them) is returned. A directory that already
    holds them all (a --store-dir used again) is kept: the group's clients keep working."""
    d = Path(d)
    key_file = d / f"{client}.key_secret"
    wanted = [d / f"{m}.key_secret" for m in member_ids] + [key_file, d / "clients" / f"{client}.key"]
    if all(p.exists() for p in wanted):
        return key_file
    if d.exists() and any(d.iterdir()):
        raise KeyFileError([f"{d}: holds keys of another group; remove it or give --keys-dir"])
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    for m in member_ids:
        keygen(d, m)
    _, sec = keygen(d / "clients", client)
    os.replace(sec, key_file)
    (d / "clients" / "rights").write_text(f"{client} admin\n", encoding="utf-8")
    return key_file
