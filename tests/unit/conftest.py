"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from child_process import Child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    try:
        yield made
    finally:
        for c in made:
            c.kill()
            for f in (c.proc.stdin, c.proc.stdout, c.proc.stderr):
                if f is not None:
                    f.close()
