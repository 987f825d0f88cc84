"""Fixtures that start real node processes. Every cluster is closed in `finally`."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster  # noqa: E402


@pytest.fixture
def make_cluster(tmp_path):
    made: list[Cluster] = []

    def factory(n: int = 3, **options) -> Cluster:
        c = Cluster(tmp_path / f"c{len(made)}", n, **options)
        made.append(c)
        return c.start()

    try:
        yield factory
    finally:
        errors = []
        for c in made:
            try:
                c.close()
            except AssertionError as e:
                errors.append(str(e))
        assert not errors, errors
