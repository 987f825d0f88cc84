"""A ``python -c`` child process driven line by line, for tests that need a second process
(the member lock, the shared block): what it prints arrives through a queue, so every read has
a deadline."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Child:
    """A ``python -c`` child with line-oriented stdout read through a queue (for deadlines)."""

    def __init__(self, code: str, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            cwd=REPO, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        self._err_thread = threading.Thread(target=self._pump_stderr, daemon=True)
        self._err_thread.start()

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        self._stderr.append(self.proc.stderr.read())

    def line(self, timeout: float = 10.0) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child said nothing for {timeout} s") from None
        if line is None:
            raise AssertionError(f"child exited: rc={self.proc.wait()} stderr={self.stderr()!r}")
        return line

    def silent_for(self, seconds: float) -> bool:
        """True if the child printed nothing for ``seconds`` (a bounded negative check)."""
        try:
            line = self._lines.get(timeout=seconds)
        except queue.Empty:
            return True
        self._lines.put(line)  # keep it for line(); order is irrelevant for our uses
        return False

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 20.0) -> int:
        """Close stdin and wait; return the exit code (stderr fully read afterwards)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout=timeout)

    def stderr(self, timeout: float = 20.0) -> str:
        # EOF on stderr means every writer is gone, including a resource tracker the child
        # might have started (it inherits the child's stderr): so its warnings are in here.
        self._err_thread.join(timeout)
        assert not self._err_thread.is_alive(), "stderr still open"
        return "".join(self._stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=20)
