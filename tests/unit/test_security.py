"""Key files, key directories, the plain-mode rule and the rights table (ipc/security.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ipc import protocol as P
from ipc.security import (
    KeyFileError,
    authorize,
    client_curve,
    is_loopback,
    keygen,
    load_server_keys,
    parse_user_id,
    read_key_file,
    read_secret_key_file,
)
from node.config import ConfigError, NodeConfig

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20913"


def keys_dir(d: Path, clients: dict[str, str] | None = None) -> Path:
    for m in ("n0", "n1"):
        keygen(d, m)
    for name, right in (clients or {}).items():
        keygen(d / "clients", name)
        with open(d / "clients" / "rights", "a") as f:
            f.write(f"{name} {right}\n")
    return d


def test_keygen_modes_and_no_overwrite(tmp_path: Path) -> None:
    pub, sec = keygen(tmp_path, "n0")
    assert stat.S_IMODE(sec.stat().st_mode) == 0o600
    assert stat.S_IMODE(pub.stat().st_mode) & 0o077 == 0o044  # readable, not writable by others
    p, s = read_secret_key_file(sec)
    assert read_key_file(pub) == (p, None)
    assert "secret-key" not in pub.read_text()
    with pytest.raises(KeyFileError, match="exists"):
        keygen(tmp_path, "n0")


@pytest.mark.parametrize("text,msg", [
    ("hello\n", "no public-key line"),
    ('curve\n    public-key = "short"\n', "not a 40-character Z85"),
])
def test_bad_key_file_is_one_line(tmp_path: Path, text: str, msg: str) -> None:
    f = tmp_path / "x.key"
    f.write_text(text)
    with pytest.raises(KeyFileError, match=msg) as e:
        read_key_file(f)
    assert len(e.value.problems) == 1 and "\n" not in str(e.value)


def test_secret_file_checks(tmp_path: Path) -> None:
    pub, sec = keygen(tmp_path, "c")
    with pytest.raises(KeyFileError, match="holds no secret-key"):
        read_secret_key_file(pub)
    sec.chmod(0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        read_secret_key_file(sec)
    with pytest.raises(KeyFileError, match="cannot read"):
        read_secret_key_file(tmp_path / "missing.key_secret")
    # a secret that does not belong to its public key
    other_pub, _ = keygen(tmp_path, "d")
    sec.chmod(0o600)
    text = sec.read_text()
    mine = read_key_file(pub)[0].decode()
    sec.write_text(text.replace(mine, read_key_file(other_pub)[0].decode()))
    with pytest.raises(KeyFileError, match="does not match"):
        read_secret_key_file(sec)


def test_server_keys_and_user_ids(tmp_path: Path) -> None:
    d = keys_dir(tmp_path, {"admin": "admin", "ro": "read"})
    k = load_server_keys(d, "n0", ["n0", "n1"])
    assert set(k.member_public) == {"n0", "n1"}
    assert sorted(k.client_keys.values()) == [("admin", "admin"), ("ro", "read")]
    assert k.public == read_key_file(d / "n0.key")[0]
    # a client's view: its secret, the members' public keys beside it (clients/ holds none)
    cc = client_curve(d / "clients" / "admin.key_secret", d)
    assert cc.server_keys["n1"] == k.member_public["n1"]


def test_server_keys_report_every_problem(tmp_path: Path) -> None:
    d = keys_dir(tmp_path, {"admin": "admin"})
    (d / "n1.key").unlink()
    (d / "clients" / "rights").write_text("admin superuser\nghost read\n")
    keygen(d / "clients", "norights")
    with pytest.raises(KeyFileError) as e:
        load_server_keys(d, "n0", ["n0", "n1"])
    text = "\n".join(e.value.problems)
    assert "n1.key: cannot read" in text
    assert "expected 'NAME read|write|admin'" in text
    assert "names 'ghost' but ghost.key is missing" in text
    assert "client 'norights'" in text and "has no line" in text
    with pytest.raises(KeyFileError, match="not a directory"):
        load_server_keys(tmp_path / "nope", "n0", ["n0"])


def test_config_check_names_key_problems_and_plain_mode_rule(tmp_path: Path) -> None:
    cfg = NodeConfig(id="n0", peers=PEERS, store_dir=str(tmp_path / "s"), keys_dir=str(tmp_path / "k"))
    with pytest.raises(ConfigError, match="keys_dir: .* is not a directory"):
        cfg.validate()
    keys_dir(tmp_path / "k")
    cfg.validate()
    (tmp_path / "k" / "n0.key_secret").chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        cfg.validate()
    NodeConfig(id="n0", peers=PEERS, store_dir=str(tmp_path / "s")).validate()  # loopback: fine
    public = "n0-192.0.2.1:20911;n1-192.0.2.2:20913"
    with pytest.raises(ConfigError, match="plain mode binds 192.0.2.1"):
        NodeConfig(id="n0", peers=public, store_dir=str(tmp_path / "s")).validate()
    NodeConfig(id="n0", peers=public, store_dir=str(tmp_path / "s"), insecure=True).validate()


def test_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.0.0.7") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("192.0.2.1") and not is_loopback("0.0.0.0")


G = "default"


@pytest.mark.parametrize("user,msg,allowed", [
    (None, P.AppendRequest(G, "n0", b"x"), True),  # plain mode
    ("client:r:read", P.GetRequest(G, "n0", 0, 1), True),
    ("client:r:read", P.MetadataRequest(G, "n0"), True),
    ("client:r:read", P.FetchRequest(G, "n0", 0, 1, 1, 0), True),
    ("client:r:read", P.AppendRequest(G, "n0", b"x"), False),
    ("client:r:read", P.OpenSessionRequest(G, "n0"), False),
    ("client:w:write", P.AppendRequest(G, "n0", b"x"), True),
    ("client:w:write", P.BatchAppendRequest(G, "n0", [b"x"]), True),
    ("client:w:write", P.LeadershipTransferRequest(G, "n0", "n1", 1), False),
    ("client:w:write", P.SnapshotRequest(G, "n0"), False),
    ("client:a:admin", P.LeadershipTransferRequest(G, "n0", "n1", 1), True),
    ("client:a:admin", P.SnapshotRequest(G, "n0"), True),
    ("client:w:write", P.MemberChangeRequest(G, "n0", 3, "n1"), False),  # membership: admin only
    ("client:a:admin", P.MemberChangeRequest(G, "n0", 3, "n1"), True),
    ("client:a:admin", P.AppendRequest(G, "n0", b"x"), True),
    ("client:a:admin", P.VoteRequest(G, "n0", "n1", 5, 1, 1), False),  # members only
    ("client:a:admin", P.PushRequest(G, "n0", "n1", 5, P.PushKind.COMMIT), False),
    ("client:a:admin", P.HeartbeatRequest(G, "n0", "n1", 5), False),
    ("client:a:admin", P.InstallRequest(G, "n0", "n1", 5, b"{}", 0), False),
    ("client:a:admin", P.ReadIndexRequest(G, "n0"), False),
    ("member:n1", P.VoteRequest(G, "n0", "n1", 5, 1, 1), True),
    ("member:n1", P.VoteRequest(G, "n0", "n2", 5, 1, 1), False),  # speaking for n2
    ("member:n1", P.HeartbeatRequest(G, "n0", "n2", 5), False),
    ("member:n1", P.PushRequest(G, "n0", "n2", 5, P.PushKind.COMMIT), False),
    ("member:n1", P.InstallRequest(G, "n0", "n2", 5, b"{}", 0), False),
    ("member:n1", P.TakeLeadershipRequest(G, "n0", "n2", 5), False),
    ("member:n1", P.PushRequest(G, "n0", "n1", 5, P.PushKind.COMMIT), True),
    ("member:n1", P.ReadIndexRequest(G, "n0"), True),
    ("member:n1", P.MetadataRequest(G, "n0"), True),
])
def test_rights_table(user: str | None, msg: object, allowed: bool) -> None:
    reason = authorize(parse_user_id(user), msg)
    assert (reason is None) == allowed, reason
    if not allowed:
        assert "\n" not in reason and len(reason) < 200


def test_cli_bad_key_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tools import cli

    keygen(tmp_path / "k", "n0")
    (tmp_path / "k" / "n1.key").write_text("garbage\n")
    peers = "n0-127.0.0.1:20911;n1-127.0.0.1:20913"
    runs = [
        (["server", "--id", "n0", "--peers", peers, "--store-dir", str(tmp_path / "s"),
          "--keys-dir", str(tmp_path / "k")], "n1.key: no public-key line"),
        (["server", "--id", "n0", "--peers", "n0-192.0.2.1:20911", "--store-dir", str(tmp_path / "s")],
         "plain mode binds 192.0.2.1"),
        (["append", "--peers", peers, "--key-file", str(tmp_path / "k" / "n0.key"), "x"],
         "holds no secret-key"),
        (["keygen", "--out", str(tmp_path / "k"), "--name", "n0"], "exists"),
    ]
    for argv, want in runs:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert want in err and "Traceback" not in err, err
    monkeypatch.setenv("DLEDGER_KEY_FILE", str(tmp_path / "missing.key_secret"))
    assert cli.main(["metadata", "--peers", peers]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dledger metadata: error: $DLEDGER_KEY_FILE:") and "\n" not in err, err


def test_a_member_key_being_rotated_is_admitted_under_both(tmp_path: Path) -> None:
    d = keys_dir(tmp_path)
    old = read_key_file(d / "n1.key")[0]
    (d / "n1.key").rename(d / "n1.prev.key")
    (d / "n1.key_secret").unlink()
    keygen(d, "n1")
    new = read_key_file(d / "n1.key")[0]
    k = load_server_keys(d, "n0", ["n0", "n1"])
    assert k.member_keys[old] == k.member_keys[new] == "n1"
    assert k.member_public["n1"] == new  # what n0 connects to: n1's current key
    assert parse_user_id("member:n1") == ("member", "n1", "admin")


def test_local_group_keys_are_made_once_and_kept(tmp_path: Path) -> None:
    from ipc.security import local_group_keys

    kf = local_group_keys(tmp_path / "keys", ["n0", "n1", "n2"])
    assert kf == tmp_path / "keys" / "admin.key_secret"
    k = load_server_keys(tmp_path / "keys", "n2", ["n0", "n1", "n2"])
    assert list(k.client_keys.values()) == [("admin", "admin")]
    assert set(client_curve(kf).server_keys) >= {"n0", "n1", "n2"}
    before = kf.read_text()
    assert local_group_keys(tmp_path / "keys", ["n0", "n1", "n2"]) == kf and kf.read_text() == before
    with pytest.raises(KeyFileError, match="another group"):  # a 4th member: not this group's keys
        local_group_keys(tmp_path / "keys", ["n0", "n1", "n2", "n3"])


def test_client_key_file_names_where_a_bad_path_came_from(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for the CLI (--key-file) and the Spark source (option keyFile): the given path,
    else $DLEDGER_KEY_FILE, else plain; a bad file's error names its source."""
    from ipc.security import KeyFileError, client_key_file

    keygen(tmp_path / "k", "c1")
    good = tmp_path / "k" / "c1.key_secret"
    monkeypatch.delenv("DLEDGER_KEY_FILE", raising=False)
    assert client_key_file(None, "--key-file") is None
    assert client_key_file(str(good), "--key-file") == str(good.resolve())
    monkeypatch.setenv("DLEDGER_KEY_FILE", str(good))
    assert client_key_file("", "option keyFile") == str(good.resolve())
    with pytest.raises(KeyFileError, match=r"^option keyFile: .*c1\.key"):
        client_key_file(str(tmp_path / "k" / "c1.key"), "option keyFile")  # public half only
    monkeypatch.setenv("DLEDGER_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(KeyFileError, match=r"^\$DLEDGER_KEY_FILE: "):
        client_key_file(None, "--key-file")
