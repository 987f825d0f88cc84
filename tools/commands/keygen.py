"""Write a CurveZMQ key pair: DIR/NAME.key (the public key, to copy where it is trusted) and
DIR/NAME.key_secret (the pair, mode 0600, created with that mode; keep it where it is used).
Refuses to overwrite an existing file (a replaced key locks its holder out).

A node's key directory (`dledger server --keys-dir DIR`) holds ID.key of every member, the
node's own ID.key_secret, and clients/NAME.key with a line `NAME read|write|admin` in
clients/rights for each client (docs/operations.md "Security").

Example:
  dledger keygen --out keys --name n0
  dledger keygen --out keys/clients --name ops && echo "ops admin" >> keys/clients/rights
"""

from __future__ import annotations

import argparse

from tools.cli import EXIT_USAGE, CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into (made if missing)")
    p.add_argument("--name", required=True, metavar="NAME",
                   help="the key's name: a member id for a node, any name for a client")


def run(args: argparse.Namespace) -> int:
    from ipc.security import KeyFileError, keygen

    try:
        pub, sec = keygen(args.out, args.name)
    except KeyFileError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    except OSError as e:
        raise CliError(f"--out {args.out}: {e.strerror or e}", EXIT_USAGE) from None
    print(pub)
    print(sec)
    return 0
