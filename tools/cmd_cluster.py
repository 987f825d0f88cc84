"""Run a local N-node group on 127.0.0.1 in the foreground (one `dledger server` per node).

Prints the peers string first (so another terminal can use `--peers`), then the nodes' logs.
SIGTERM/SIGINT stops every node cleanly (SIGTERM, grace, SIGKILL) and exits 0. Without
--store-dir the stores live in a temporary directory that is removed at the end; with it, node
i uses DIR/n<i> and the data stays.

With --metrics-port P, node i serves its metrics on port P + i.

Example:
  dledger cluster --nodes 3
  dledger metadata --peers "<the printed peers string>" --json
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from node.config import ConfigError, add_node_arguments, build_config, cli_values
from node.ports import free_port_pairs
from tools.cli import CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    p.add_argument("--base-port", type=int, default=None,
                   help="node i listens on BASE+2i (and BASE+2i+1); default: free ports")
    p.add_argument("--store-dir", dest="cluster_store_dir", default=None,
                   help="parent directory for the nodes' stores (default: a temporary one)")
    add_node_arguments(p, skip=("id", "peers", "store_dir", "run_dir"))


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.nodes <= 15:
        raise CliError("--nodes must be between 1 and 15", 2)
    ports = ([args.base_port + 2 * i for i in range(args.nodes)] if args.base_port
             else free_port_pairs(args.nodes))
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
    options = cli_values(args)
    try:  # validate once here so a bad option is one clear message, not N crashed servers
        build_config({}, {**options, "id": "n0", "peers": peers, "store_dir": "/tmp/x"})
    except ConfigError as e:
        for problem in e.problems:
            print(f"dledger cluster: invalid option: {problem}", file=sys.stderr)
        return 2
    own_root = args.cluster_store_dir is None
    root = Path(args.cluster_store_dir or tempfile.mkdtemp(prefix="dledger-cluster-"))
    print(peers, flush=True)
    flags = [x for k, v in options.items() if k != "metrics_port"
             for x in ("--" + k.replace("_", "-"), str(v))]
    procs: list[subprocess.Popen] = []
    stop = {"now": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["now"] = True

    r, w = os.pipe()
    os.set_blocking(w, False)
    old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i in range(args.nodes):
            cmd = [sys.executable, "-m", "tools.cli", "server", "--id", f"n{i}", "--peers", peers,
                   "--store-dir", str(root / f"n{i}"), *flags]
            if options.get("metrics_port"):  # --metrics-port P: node i serves P + i
                cmd += ["--metrics-port", str(int(options["metrics_port"]) + i)]
            if getattr(args, "debug", False):
                cmd.insert(3, "--debug")
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
        while not stop["now"]:
            select.select([r], [], [], 1.0)
            for i, p in enumerate(procs):
                if p.poll() is not None and p.returncode != 0 and not stop["now"]:
                    print(f"dledger cluster: node n{i} exited with {p.returncode}", file=sys.stderr)
                    procs[i].returncode = 0  # report once
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
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old.items():
            signal.signal(s, h)
        os.close(r)
        os.close(w)
        if own_root:
            shutil.rmtree(root, ignore_errors=True)
    return 0
