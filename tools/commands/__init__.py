"""The `dledger` subcommands, one module per command, named after it (`dledger kv` is
tools/commands/kv.py).

The file name is the command name, without a `cmd_` prefix: the package already says these are
commands, and tools/cli.py's SUBCOMMANDS maps each name to its module. tools/cli.py owns the
parser, the error handling and the lazy import (a command's module is imported only when it
runs, so `dledger dump` never pays for zmq or pyspark); each module here has a docstring (its
--help text), `add_arguments(parser)` and `run(args) -> int`.

What several commands share lives here too: group_status.py is no command of its own (it
probes every node of a group for `metadata`, `health` and `top`), and metadata.py also holds
the argument and client helpers (`add_client_arguments`, `add_json_argument`, `open_client`,
`cli_error`) that `append`, `get`, `kv`, `transfer`, `snapshot`, `config` and `export` use.
"""
