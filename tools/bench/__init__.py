"""Benchmarks and what `dledger bench` measures with, apart from the commands and the node.

Each benchmark is a module run as `python -m tools.bench.NAME --help` from the repository root
(docs/performance.md gives every command line and what it measured): store.py (the store in one
process), push_check.py (the follower's fast path), restart.py (open time by store size),
failover.py (elections after SIGKILL, idle cost), idle_cpu.py (CPU of an idle group),
cpu_per_entry.py (CPU per entry for fixed work), install.py (snapshot and install of a large
state), decode.py (the Spark pipeline) and etcd.py (etcd doing the KV bench's work, run by
another interpreter that has grpcio). record.py and progress.py are not benchmarks: they are
the recorder and the live view of `dledger bench` (tools/commands/bench.py).

This package imports nothing itself, so etcd.py runs under an interpreter without the
project's dependencies, and cpu_per_entry.py can run as a file from another tree's copy.
"""
