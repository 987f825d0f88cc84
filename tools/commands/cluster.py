"""Run a local N-node group on 127.0.0.1 in the foreground (one `dledger server` per node).

Prints the peers string first, alone on its line (so another terminal or a script can use
`--peers`), then the nodes' logs. SIGTERM/SIGINT (Ctrl-C, at any moment, start-up included)
stops every node cleanly (SIGTERM, grace, SIGKILL) and exits 0, quietly: the nodes run in
their own process groups, so a Ctrl-C reaches only this command, which stops them.

A node that stops by itself with an error (it cannot bind its port, its store is damaged...)
stops the whole group: one line `dledger cluster: error: node n1 stopped: <its reason>`, exit
1. A node killed by a signal (an experiment: `kill -9` of one node) is reported in one line
and the others keep running. Without --store-dir the stores live in a temporary directory removed at
the end (also on SIGTERM/SIGINT; one left by a cluster that was SIGKILLed is removed by the
next `dledger cluster`); with it, node i uses DIR/n<i> and the data stays.

Segment files default to 64MiB data / 8MiB index here (`dledger server`: 1GiB / 160MiB), so a
3-node demo reserves about 220 MB of disk, not 3.5 GB; --data-file-size/--index-file-size
choose others, and an existing --store-dir keeps the sizes it was created with. Every other
option is passed to each `dledger server` (see `dledger server --help`).

With --metrics-port P, node i serves its metrics on port P + i.

Secure by default: the group's CurveZMQ keys are made under the stores' directory (keys/, kept
with --store-dir and used again) and the second line says `key-file: PATH`, the secret key of
an `admin` client; give it to client commands with --key-file or export it once as
DLEDGER_KEY_FILE. --insecure runs the nodes in plain mode (no keys, no second line); --keys-dir
DIR uses your keys (second line only when DIR/admin.key_secret exists).

Example:
  dledger cluster --nodes 3
  dledger cluster --nodes 3 --base-port 20911 --log-format json
  export DLEDGER_KEY_FILE=<the path after key-file:>
  dledger metadata --peers "<the printed peers string>" --json
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from node.config import (
    LOCAL_DATA_FILE_SIZE,
    LOCAL_INDEX_FILE_SIZE,
    ConfigError,
    add_node_arguments,
    build_config,
    cli_values,
    configure_logging,
    format_size,
)
from node.host.interpreter import child_env, module_command
from node.wiring.ports import free_port_pairs
from tools.cli import EXIT_USAGE, CliError

MAX_NODES = 15
TEMP_PREFIX = "dledger-cluster-"
SERVER_ERROR = b"dledger server: error: "
# The nodes' resource trackers (multiprocessing's, which remove a SIGKILLed supervisor's
# shared-memory block: node/block/shared_state.py) announce that clean-up as a "leaked
# shared_memory objects" UserWarning on the group's stderr. Under `dledger cluster` a killed
# node is reported by this command in one line instead, so that warning is filtered, and only
# it (warnings' module field matches the whole module name).
TRACKER_WARNING_FILTER = "ignore::UserWarning:multiprocessing.resource_tracker"


class NodeOutput:
    """One node's stderr, copied line by line to ours by a thread, except its last words
    (`dledger server: error: REASON`), which are kept: the cluster's own line says them with
    the node's name. Lines stay whole (each node's log lines arrive through its own pipe)."""

    def __init__(self, node: str, stream: IO[bytes]) -> None:
        self.node = node
        self.reason: str | None = None
        self._stream = stream
        self._thread = threading.Thread(target=self._copy, name=f"{node}-stderr", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        out = sys.stderr.buffer
        for line in iter(self._stream.readline, b""):
            if line.startswith(SERVER_ERROR):
                self.reason = line[len(SERVER_ERROR):].decode("utf-8", "replace").strip()
                continue
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):  # our stderr is gone: keep draining the node's pipe
                pass
        self._stream.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def remove_left_segments(group: str, stores: dict[str, Path]) -> list[str]:
    """Unlink the shared-memory blocks (/dev/shm) these nodes left, once all of their
    supervisors have exited; the names removed.

    Why: a node stopped in the first moments of its start-up (Ctrl-C right after `dledger
    cluster` began) can die of the SIGTERM before its supervisor has installed its handler and
    after it has created its block; the block's resource tracker usually unlinks it, but not if
    the supervisor died before registering it. Once no supervisor of ours runs, a block with
    one of our nodes' names is stale by definition (the next start of that node would remove
    it too, but a temporary cluster's nodes never start again)."""
    from node.block.shared_state import segment_name

    removed = []
    for nid, store in stores.items():
        seg = Path("/dev/shm", segment_name(group, nid, store))
        try:
            seg.unlink()
            removed.append(seg.name)
        except FileNotFoundError:
            pass
        except OSError:  # another user's, or no /dev/shm: not ours to force
            pass
    return removed


def _exit_line(node: str, rc: int, reason: str | None) -> str:
    """What the cluster says of a node that exited on its own (rc != 0)."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"node {node} was killed by {name}; the other nodes keep running"
    return f"node {node} stopped: {reason or f'exit code {rc}, see its log above'}"


def _nodes(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= n <= MAX_NODES:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_NODES}, got {n}")
    return n


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= n <= 65534:
        raise argparse.ArgumentTypeError(f"must be between 1 and 65534, got {n}")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=_nodes, default=3, metavar="N",
                   help=f"number of nodes, 1-{MAX_NODES} (default: %(default)s)")
    p.add_argument("--base-port", type=_port, default=None, metavar="PORT",
                   help="node i listens on PORT+2i (and PORT+2i+1) (default: free ports)")
    p.add_argument("--store-dir", dest="cluster_store_dir", default=None, metavar="DIR",
                   help="parent of the nodes' stores, kept at exit (default: a temporary one, removed)")
    add_node_arguments(p, skip=("id", "peers", "store_dir", "run_dir"),
                       defaults={"data_file_size": LOCAL_DATA_FILE_SIZE,
                                 "index_file_size": LOCAL_INDEX_FILE_SIZE})


def _existing_file_size(d: Path) -> int | None:
    """The size of the segment files already in `d` (a store made earlier), else None."""
    try:
        return next((f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()), None)
    except OSError:
        return None


def run(args: argparse.Namespace) -> int:
    if args.base_port is not None and args.base_port + 2 * args.nodes > 65535:
        raise CliError(f"--base-port {args.base_port} leaves no room for {args.nodes} nodes "
                       "(each needs 2 ports)", EXIT_USAGE)
    ports = ([args.base_port + 2 * i for i in range(args.nodes)] if args.base_port
             else free_port_pairs(args.nodes))
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
    options = cli_values(args)
    for name, small, sub in (("data_file_size", LOCAL_DATA_FILE_SIZE, "data"),
                             ("index_file_size", LOCAL_INDEX_FILE_SIZE, "index")):
        if name not in options:
            existing = (_existing_file_size(Path(args.cluster_store_dir) / "n0" / sub)
                        if args.cluster_store_dir else None)
            options[name] = format_size(existing or small)
    try:  # validate once here so a bad option is one clear message, not N crashed servers
        cfg0 = build_config({}, {**options, "id": "n0", "peers": peers,
                          "store_dir": str(Path(args.cluster_store_dir or "/tmp") / "n0")})
    except ConfigError as e:
        for problem in e.problems:
            print(f"dledger cluster: invalid option: {problem}", file=sys.stderr)
        return EXIT_USAGE
    debug = getattr(args, "debug", False)
    configure_logging(options.get("log_level", "info"), options.get("log_format", "text"), debug=debug)
    flags = [x for k, v in options.items() if k != "metrics_port"
             for x in ("--" + k.replace("_", "-"), str(v))]
    procs: list[subprocess.Popen] = []
    outputs: list[NodeOutput] = []
    stop = {"now": False}
    failed: str | None = None

    def on_signal(signum: int, _frame: object) -> None:
        stop["now"] = True

    env = child_env()
    env["PYTHONWARNINGS"] = ",".join(x for x in (env.get("PYTHONWARNINGS"), TRACKER_WARNING_FILTER) if x)
    # Signals first, the temporary directory second: a SIGTERM at any moment after this
    # line ends in the `finally` that removes it.
    r, w = os.pipe()
    os.set_blocking(w, False)
    old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    root: Path | None = None
    root_fd: int | None = None
    try:
        if args.cluster_store_dir:
            root = Path(args.cluster_store_dir)
        else:
            from node.host.rundirs import make_owned_tempdir

            root, root_fd = make_owned_tempdir(TEMP_PREFIX)
        print(peers, flush=True)
        # Secure by default: keys for this group (a --keys-dir of the user's is used as it is),
        # and the admin client's key file on the second line, for --key-file/$DLEDGER_KEY_FILE.
        if not cfg0.keys_dir and not cfg0.insecure:
            from ipc.security import KeyFileError, local_group_keys

            try:
                key_file = local_group_keys(root / "keys", [f"n{i}" for i in range(args.nodes)])
            except (KeyFileError, OSError) as e:
                raise CliError(f"cannot make the group's keys: {e}") from None
            flags += ["--keys-dir", str(root / "keys")]
            print(f"key-file: {key_file}", flush=True)
        elif cfg0.keys_dir:
            key_file = Path(cfg0.keys_dir) / "admin.key_secret"
            if key_file.exists():
                print(f"key-file: {key_file}", flush=True)
        from node.roles.runtime import die_with_parent

        for i in range(args.nodes):
            if stop["now"]:
                break
            cmd = module_command("tools.cli", "server", "--id", f"n{i}", "--peers", peers,
                                 "--store-dir", str(root / f"n{i}"), *flags)
            if options.get("metrics_port"):  # --metrics-port P: node i serves P + i
                cmd += ["--metrics-port", str(int(options["metrics_port"]) + i)]
            if debug:
                cmd.insert(4, "--debug")
            # die_with_parent: a cluster killed with SIGKILL still stops its nodes (SIGTERM).
            # process_group=0: the terminal's Ctrl-C (SIGINT to the foreground process group)
            # reaches this command only; the nodes, interrupted in the middle of their imports,
            # used to print a hundred lines of KeyboardInterrupt tracebacks. This command stops
            # them with SIGTERM instead, which every stage of a node's start-up obeys quietly.
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                 preexec_fn=die_with_parent, process_group=0)
            procs.append(p)
            outputs.append(NodeOutput(f"n{i}", p.stderr))
        reported: set[int] = set()
        while not stop["now"] and failed is None:
            select.select([r], [], [], 1.0)
            for i, p in enumerate(procs):
                if i in reported or p.poll() is None or p.returncode == 0 or stop["now"]:
                    continue
                reported.add(i)
                outputs[i].join(2.0)  # its last line (the reason) is read before we speak
                line = _exit_line(f"n{i}", p.returncode, outputs[i].reason)
                if p.returncode > 0:  # it stopped by itself: it cannot work, so neither can we
                    failed = line
                    break
                print(f"dledger cluster: {line}", file=sys.stderr, flush=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for out in outputs:
            out.join(2.0)
        if root is not None:
            remove_left_segments(str(options.get("group") or "default"),
                                 {f"n{i}": root / f"n{i}" for i in range(len(procs))})
        if root_fd is not None:
            from node.host.rundirs import release

            release(root, root_fd)
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old.items():
            signal.signal(s, h)
        os.close(r)
        os.close(w)
    if failed is not None:
        raise CliError(f"{failed}; all nodes stopped")
    return 0
