"""Role processes keep push-sized buffers in the heap (node/roles/runtime.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from node.roles import runtime

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_role_process_stops_faulting_in_a_fresh_mapping_for_every_frame():
    """After `keep_buffers_in_heap`, allocating and freeing frame-sized buffers (what a
    dispatcher does per push) costs no page faults once warm; with glibc's defaults each
    200 KiB-4 MiB buffer is a fresh mmap that faults in page by page."""
    code = """
import resource, sys
from node.roles.runtime import keep_buffers_in_heap
if sys.argv[1] == "tuned":
    assert keep_buffers_in_heap()
def churn():
    for k in range(300):
        a = bytearray(4 << 20 if k % 7 == 0 else 200 << 10)  # written: the kernel maps its pages
        b = bytes(a)
        del a, b
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    faults = {mode: int(subprocess.run([sys.executable, "-c", code, mode], check=True, text=True,
                                       capture_output=True).stdout)
              for mode in ("default", "tuned")}
    assert faults["tuned"] < 100 < faults["default"], faults


def test_without_glibc_nothing_changes(monkeypatch):
    def no_libc(_name):
        raise OSError("no libc")

    monkeypatch.setattr(runtime.ctypes, "CDLL", no_libc)
    assert runtime.keep_buffers_in_heap() is False
