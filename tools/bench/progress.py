"""The bench's live view on stderr: its phases with rich.progress on a terminal, one plain line
per second otherwise.

Why phases: a bench spends real time outside its measured window — starting a local group,
putting the keys a get bench reads, reading back what it wrote — and a silent terminal during
any of them looks like a hang. Each phase is one rich task (a bar with time remaining when its
size is known, a pulsing bar when it is not, e.g. waiting for a leader). Off a terminal (CI,
`| tee`), the same events are plain lines, at most one a second, so a log stays readable; with
--json nothing is printed (stdout is the result, stderr stays quiet unless something fails).
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class BenchProgress:
    """`phase()` starts a step (finishing the previous one); `update()` moves it on."""

    PLAIN_EVERY_S = 1.0

    def __init__(self, *, quiet: bool, tty: bool | None = None) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._task: TaskID | None = None
        self._name = ""
        self._total: float | None = None
        self._last_plain = 0.0
        self._rich: Progress | None = None
        if not quiet and self.tty:
            self._rich = Progress(
                SpinnerColumn(), TextColumn("[bold]{task.description:<11}"), BarColumn(bar_width=24),
                TaskProgressColumn(), TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                TextColumn("{task.fields[figures]}"),
                console=Console(stderr=True), refresh_per_second=4)
            self._rich.start()

    def phase(self, name: str, total: float | None = None) -> None:
        """Start phase `name`, `total` units long (None: unknown, e.g. a leader election)."""
        self._finish()
        self._name, self._total = name, total
        if self._rich is not None:
            self._task = self._rich.add_task(name, total=total, figures="")
        elif not self.quiet:
            print(f"{name} ...", file=sys.stderr, flush=True)
            self._last_plain = time.monotonic()

    def update(self, completed: float, figures: str = "", description: str | None = None) -> None:
        """Phase progress (in its own units) and a line of live figures."""
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, completed=completed, figures=figures,
                              **({"description": description} if description else {}))
            return
        now = time.monotonic()
        if self.quiet or now - self._last_plain < self.PLAIN_EVERY_S:
            return
        self._last_plain = now
        done = f"{completed:,.0f}/{self._total:,.0f}" if self._total else f"{completed:,.0f}"
        print(f"{description or self._name:<11} {done:>15}  {figures}", file=sys.stderr, flush=True)

    def _finish(self) -> None:
        if self._rich is not None and self._task is not None:
            total = self._rich.tasks[-1].total or 1  # an unknown-size step that ended is whole
            self._rich.update(self._task, total=total, completed=total)
            self._rich.stop_task(self._task)
        self._task = None

    def stop(self) -> None:
        """Finish the last phase and give the terminal back (idempotent)."""
        self._finish()
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
