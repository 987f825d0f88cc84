"""Live view of a group, refreshed every second: one row per node.

Columns: role, member (voter, learner or removed, and the configuration entry counted), term,
committed/end index, lag (entries behind the leader, from the leader's
watermarks), entries/s (committed index moving), MB/s (bytes written to that node's store),
append p99 (leader: received -> committed over the last refresh, from its append-latency
histogram, which every node returns in its METADATA status trailer), disk (the store's
segment files, and how full the file system is), last leader change (as that node saw it).
A node that does not answer within --timeout is shown DOWN.

Rates and p99 are differences between two refreshes, so --once samples twice, --interval
apart, and prints the second sample. --json prints one JSON object per refresh (one line each;
with --once exactly one): {"group", "leader", "term", "nodes": [{"id", "address", "alive",
"role", "term", "committed_index", "ledger_end_index", "lag", "entries_per_s", "mb_per_s",
"append_p99_ms", "store_bytes", "disk_usage_ratio", "leader_change_age_s", "version", "member",
"config_index"}]}. `member` is voter, learner or removed, as the node sees itself in the newest
configuration of its log, shown with that entry's index (`config_index`; -1: none yet).
--save-svg FILE also writes the last frame as an SVG picture (rich's export).

Exit codes: 0 (Ctrl-C ends the live view), 1 no node answered (--once/--json), 2 bad arguments.

Example:
  dledger top --peers "n0-127.0.0.1:20911;n1-127.0.0.1:20913;n2-127.0.0.1:20915"
  dledger top --peers "n0-127.0.0.1:20911" --once --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from node.observe.histogram import LATENCY_MS, quantile
from tools.cli import CliError, add_group_arguments, key_file_of, positive_float
from tools.commands.group_status import GroupProbe, GroupView, NodeAnswer, read_group


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_group_arguments(p)
    p.add_argument("--interval", type=positive_float, default=1.0, metavar="S",
                   help="seconds between refreshes (default: %(default)s)")
    p.add_argument("--timeout", type=positive_float, default=0.5, metavar="S",
                   help="how long to wait for each node per refresh, in seconds (default: %(default)s)")
    p.add_argument("--once", action="store_true", help="print one frame and exit (default: live)")
    p.add_argument("--json", action="store_true",
                   help="print JSON, one object per refresh (default: a table)")
    p.add_argument("--save-svg", default=None, metavar="FILE",
                   help="also write the last frame as an SVG picture (default: none)")


@dataclass
class Row:
    """One node in one frame; None where unknown (DOWN, or no previous sample for a rate)."""

    id: str
    address: str
    alive: bool
    role: str | None = None
    term: int | None = None
    committed_index: int | None = None
    ledger_end_index: int | None = None
    lag: int | None = None
    entries_per_s: float | None = None
    mb_per_s: float | None = None
    append_p99_ms: float | None = None
    store_bytes: int | None = None
    disk_usage_ratio: float | None = None
    leader_change_age_s: float | None = None
    version: str | None = None
    # as this node sees itself in the newest configuration of its log: voter, learner, removed
    member: str | None = None
    config_index: int | None = None  # that configuration's entry (-1: still the --peers one)


def rows(view: GroupView, prev: dict[str, NodeAnswer]) -> list[Row]:
    """One frame's rows; rates from `prev` (each node's answer in the previous frame)."""
    out = []
    for a in view.answers:
        if a.meta is None:
            out.append(Row(a.id, a.address, False))
            continue
        m, st = a.meta, a.meta.status
        r = Row(a.id, a.address, True, a.role, m.term, m.committed_index, m.ledger_end_index,
                lag=view.lag.get(a.id))
        if st is not None:
            r.store_bytes = st.store_bytes
            r.disk_usage_ratio = st.disk_usage_ratio
            r.leader_change_age_s = st.leader_change_age_ms / 1000 if st.leader_change_age_ms >= 0 else None
            r.version = st.version
            if st.configuration is not None:
                r.config_index, voters, learners = st.configuration
                r.member = "voter" if a.id in voters else "learner" if a.id in learners else "removed"
        p = prev.get(a.id)
        if p is not None and p.meta is not None and a.at > p.at:
            dt = a.at - p.at
            r.entries_per_s = max(0, m.committed_index - p.meta.committed_index) / dt
            ps = p.meta.status
            if st is not None and ps is not None:
                r.mb_per_s = max(0, st.end_pos - ps.end_pos) / dt / 1e6
                if len(st.append_latency) == len(ps.append_latency) == len(LATENCY_MS) + 1:
                    delta = [x - y for x, y in zip(st.append_latency, ps.append_latency, strict=True)]
                    if min(delta) >= 0:
                        r.append_p99_ms = quantile(LATENCY_MS, delta, 0.99)
        out.append(r)
    return out


def frame_dict(group: str, view: GroupView, frame: list[Row]) -> dict[str, Any]:
    return {"group": group, "leader": view.leader.id if view.leader else None, "term": view.term,
            "nodes": [vars(r) for r in frame]}


def _fmt(v: Any, spec: str = "", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _bytes(n: int | None) -> str:
    if n is None or n < 0:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n}B"


def _age(s: float | None) -> str:
    if s is None:
        return "never"
    if s < 120:
        return f"{s:.0f}s ago"
    if s < 7200:
        return f"{s / 60:.0f}m ago"
    return f"{s / 3600:.1f}h ago"


def table(group: str, view: GroupView, frame: list[Row]):  # noqa: ANN201 - rich Table
    from rich.table import Table

    title = (f"group {group}: leader {view.leader.id if view.leader else '[bold red]none[/]'}, "
             f"term {_fmt(view.term)}, {sum(r.alive for r in frame)}/{len(frame)} alive")
    t = Table(title=title, title_justify="left", caption=time.strftime("%H:%M:%S"),
              caption_justify="right")
    cols = [("node", "left"), ("role", "left"), ("member", "left"), ("term", "right"),
            ("committed/end", "right"), ("lag", "right"), ("entries/s", "right"), ("MB/s", "right"),
            ("p99 ms", "right"), ("disk", "right"), ("leader change", "right")]
    for name, justify in cols:  # node and role never squeezed: what a narrow terminal must show
        t.add_column(name, justify=justify, no_wrap=True,
                     min_width={"node": 4, "role": 9}.get(name))
    for r in frame:
        if not r.alive:
            t.add_row(r.id, "[bold red]DOWN[/]", *["-"] * (len(cols) - 2))
            continue
        role = {"LEADER": "[bold green]LEADER[/]", "CANDIDATE": "[yellow]CANDIDATE[/]"}.get(r.role, r.role)
        lag = _fmt(r.lag)
        if r.lag is not None and r.lag > 10_000:
            lag = f"[bold red]{lag}[/]"
        disk = _bytes(r.store_bytes)
        if r.disk_usage_ratio is not None and r.disk_usage_ratio >= 0:
            disk += f" ({r.disk_usage_ratio:.0%})"
        member = _fmt(r.member)
        if r.member is not None and r.config_index is not None and r.config_index >= 0:
            member += f" @{r.config_index}"  # the configuration entry it counts
        t.add_row(r.id, role, member, _fmt(r.term), f"{_fmt(r.committed_index)}/{_fmt(r.ledger_end_index)}",
                  lag, _fmt(r.entries_per_s, ",.0f"), _fmt(r.mb_per_s, ".2f"),
                  _fmt(r.append_p99_ms, ".1f"), disk, _age(r.leader_change_age_s))
    return t


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    # a terminal's own width; piped or recorded output gets room for every column
    console = Console(record=bool(args.save_svg), width=None if sys.stdout.isatty() else 132)
    prev: dict[str, NodeAnswer] = {}
    last = None
    with GroupProbe(args.peers, args.group, timeout=args.timeout,
                    key_file=key_file_of(args)) as probe:

        def sample() -> tuple[GroupView, list[Row]]:
            view = read_group(probe.round(want_config=True))
            frame = rows(view, prev)
            prev.update({a.id: a for a in view.answers if a.alive})
            return view, frame

        if args.once:
            sample()
            time.sleep(args.interval)
            view, frame = sample()
            if not any(r.alive for r in frame):
                raise CliError(f"no node answered within {args.timeout:g}s")
            if args.json:
                print(json.dumps(frame_dict(args.group, view, frame)))
            else:
                last = table(args.group, view, frame)
                console.print(last)
        elif args.json:
            try:
                while True:
                    view, frame = sample()
                    print(json.dumps(frame_dict(args.group, view, frame)), flush=True)
                    time.sleep(args.interval)
            except KeyboardInterrupt:
                return 0
        else:
            view, frame = sample()
            last = table(args.group, view, frame)
            try:
                with Live(last, console=console, auto_refresh=False, transient=False) as live:
                    while True:
                        time.sleep(args.interval)
                        view, frame = sample()
                        last = table(args.group, view, frame)
                        live.update(last, refresh=True)
            except KeyboardInterrupt:
                pass
    if args.save_svg and last is not None:
        if args.once:
            console.save_svg(args.save_svg, title="dledger top")
        else:
            rec = Console(record=True, width=max(console.width, 132))
            rec.print(last)
            rec.save_svg(args.save_svg, title="dledger top")
    return 0
