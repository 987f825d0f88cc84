"""`dledger chaos`: seeded fault injection against a local group, judged by a history check.

faults.py (what is injected, from a seeded schedule), workload.py (writers, readers, leader
monitor), history.py (what was recorded, and the pure checks), run.py (one run, start to
verdict), plot.py (`--plot`). The command itself is tools/commands/chaos.py; docs/chaos.md.
"""
