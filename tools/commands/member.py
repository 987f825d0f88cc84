"""Online membership change (docs/membership.md): list the members, add one, promote a learner,
remove one. One change at a time, each answered once its configuration entry committed.

  list      the newest configuration in the leader's log: voters and learners, each with its
            address and how far behind the leader it is
  add       --id ID --address HOST:PORT: joins as a learner (it receives the log, never votes);
            without --learner the command then waits until it has caught up and promotes it
  promote   --id ID: a caught-up learner becomes a voter (retried while it is still behind)
  remove    --id ID: a voter or a learner leaves; a leader that removes itself leads until
            the change commits, then steps down (`dledger transfer` first is gentler)

A change needs the admin right in a secure group (--key-file). Answers: exit 0 when done, also
when the group already was what the change asks (MEMBERSHIP_NO_CHANGE: a retried command whose
first attempt landed); a refusal is one line with its code, exit 1; an outcome the group could
not confirm in --timeout is exit 3 (list again to see it).

Today the members are the `--peers` members (docs/membership.md "Next steps"): a change naming
another machine is refused with UNSUPPORTED.

Examples:
  dledger member list --peers "$P"
  dledger member remove --peers "$P" --id n2
  dledger member add --peers "$P" --id n2 --address 127.0.0.1:20915 --learner
  dledger member promote --peers "$P" --id n2
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from tools.cli import CliError
from tools.commands.metadata import (
    EXIT_USAGE,
    add_client_arguments,
    add_json_argument,
    cli_error,
    open_client,
)

if TYPE_CHECKING:
    from ipc.client import DLedgerClient

ADD_LEARNER, PROMOTE, REMOVE = 1, 2, 3  # node/core/membership.py ChangeKind
RETRY_S = 0.2  # between attempts of a change the group asks to retry (behind, in progress)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("list", "add", "remove", "promote"),
                   help="what to do (see above)")
    add_client_arguments(p, timeout=30.0)
    p.add_argument("--id", metavar="ID", help="the member to add, promote or remove (default: none; "
                                             "required but for list)")
    p.add_argument("--address", metavar="HOST:PORT",
                   help="add: the new member's data port (default: none; required by add)")
    p.add_argument("--learner", action="store_true",
                   help="add: leave it a learner (default: promote it once it has caught up)")
    add_json_argument(p, 'one object: list {"index", "leader", "voters", "learners"}, a change '
                         '{"action", "id", "index"}')


def _address(text: str | None) -> tuple[str, int]:
    host, sep, port = (text or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65535:
        raise CliError(f"--address {text!r}: expected HOST:PORT with a port 1..65534", EXIT_USAGE)
    return host, int(port)


def _change(c: DLedgerClient, kind: int, member: str, host: str, port: int, deadline: float) -> int | None:
    """One change, retried while the group says "not yet" (LEARNER_BEHIND, a change in
    progress, the leader's term not ready); its entry's index, or None when the group already
    was what it asks."""
    from ipc.client import DLedgerError

    while True:
        left = deadline - time.monotonic()
        try:
            return c.change_membership(kind, member, host, port, timeout=max(left, 0.1))
        except DLedgerError as e:
            if e.name == "MEMBERSHIP_NO_CHANGE":
                return None
            retry = e.name in ("LEARNER_BEHIND", "MEMBERSHIP_CHANGE_IN_PROGRESS", "TERM_NOT_READY")
            if not retry or e.indeterminate or time.monotonic() + RETRY_S >= deadline:
                raise cli_error(e, prefix=f"{_VERB[kind]} {member}: ") from None
            time.sleep(RETRY_S)


_VERB = {ADD_LEARNER: "add", PROMOTE: "promote", REMOVE: "remove"}


def _list(args: argparse.Namespace) -> int:
    from tools.cli import key_file_of
    from tools.commands.group_status import GroupProbe

    probe = GroupProbe(args.peers, args.group, min(args.timeout, 3.0), key_file_of(args))
    try:
        answers = probe.round(want_config=True)
    finally:
        probe.close()
    alive = [a for a in answers if a.meta is not None and a.meta.status is not None
             and a.meta.status.configuration is not None]
    if not alive:
        raise CliError("no member answered with its configuration (down, or older than this tool)")
    leader_id = next((a.meta.leader_id for a in alive if a.meta.leader_id), "")
    src = next((a for a in alive if a.id == leader_id), None) or max(
        alive, key=lambda a: a.meta.status.configuration[0])  # no leader: the newest one known
    index, voters, learners = src.meta.status.configuration
    end = src.meta.ledger_end_index
    peers = {p.id: p for p in src.meta.peers}

    def row(nid: str, kind: str) -> dict:
        p = peers.get(nid)
        lag = end - p.match_index if p is not None and p.match_index >= 0 and src.id == leader_id else None
        return {"id": nid, "role": kind, "address": p.address if p is not None else "",
                "behind": lag}

    rows = [row(v, "voter") for v in voters] + [row(x, "learner") for x in learners]
    if args.json:
        print(json.dumps({"index": index, "leader": leader_id or None, "voters": list(voters),
                          "learners": list(learners), "members": rows}))
        return 0
    origin = "--peers (no configuration entry yet)" if index < 0 else f"entry {index}"
    print(f"configuration: {origin}; leader: {leader_id or 'none'} (as {src.id} sees it)")
    for r in rows:
        behind = "" if r["behind"] is None else f"  {r['behind']} behind"
        print(f"  {r['id']:<12} {r['role']:<8} {r['address']}{behind}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        return _list(args)
    if not args.id:
        raise CliError(f"member {args.action} needs --id", EXIT_USAGE)
    host, port = _address(args.address) if args.action == "add" else ("", 0)
    if args.action != "add" and (args.address or args.learner):
        raise CliError(f"--address and --learner go with `member add`, not {args.action}", EXIT_USAGE)
    deadline = time.monotonic() + args.timeout
    with open_client(args) as c:
        if args.action == "add":
            index = _change(c, ADD_LEARNER, args.id, host, port, deadline)
            if not args.learner:  # then promote it once it has caught up
                promoted = _change(c, PROMOTE, args.id, "", 0, deadline)
                index = promoted if promoted is not None else index
        else:
            index = _change(c, PROMOTE if args.action == "promote" else REMOVE, args.id, "", 0, deadline)
    if args.json:
        print(json.dumps({"action": args.action, "id": args.id, "index": index}))
        return 0
    done = {"add": "added as a learner" if args.learner else "added and promoted to voter",
            "promote": "promoted to voter", "remove": "removed"}[args.action]
    where = "already so (no change)" if index is None else f"configuration entry {index}"
    print(f"{args.id} {done}: {where}")
    return 0
