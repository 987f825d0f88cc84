"""Fixtures that start real node processes. Every cluster is closed in `finally`."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster  # noqa: E402


@pytest.fixture
def make_cluster(tmp_path):
    made: list[Cluster] = []

    def factory(n: int = 3, start: bool = True, **options) -> Cluster:
        # Small segment files: tests never need 1 GiB each, and rolling gets exercised.
        options.setdefault("data_file_size", 32 << 20)
        options.setdefault("index_file_size", 4 << 20)
        c = Cluster(tmp_path / f"c{len(made)}", n, **options)
        made.append(c)
        return c.start() if start else c

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
