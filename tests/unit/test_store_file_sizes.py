"""node/store/layout.py `existing_file_sizes`: the segment sizes a store was made with, read so
that damage (a truncated or deleted file, which the store repairs) never passes for another
size, and `node/config.py` `adopt_store_file_sizes` on top of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import NodeConfig, adopt_store_file_sizes
from node.store.layout import DATA_DIR, INDEX_DIR, existing_file_sizes

MIB = 1 << 20


def files(root: Path, sub: str, *sizes_at: tuple[int, int]) -> None:
    d = root / sub
    d.mkdir(parents=True, exist_ok=True)
    for start, size in sizes_at:
        with open(d / f"{start:020d}", "wb") as f:
            f.truncate(size)


@pytest.mark.parametrize("data, index, want", [
    ([(0, 64 * MIB)], [(0, 8 * MIB)], {"data_file_size": 64 * MIB, "index_file_size": 8 * MIB}),
    ([(0, 4 * MIB), (4 * MIB, 4 * MIB), (8 * MIB, 1000)], [], {"data_file_size": 4 * MIB}),  # a torn last file
    ([(0, 4 * MIB), (8 * MIB, 4 * MIB)], [], {"data_file_size": 4 * MIB}),  # a middle file deleted
    ([(0, 4 * MIB), (4 * MIB, 3000)], [], {"data_file_size": 4 * MIB}),  # two files, one torn
    ([(0, 3200)], [(0, 3200)], {}),  # one torn file: not a size (the store repairs it)
    ([(0, 3 * 1024 * MIB)], [], {"data_file_size": 3 * 1024 * MIB}),  # bigger than configured
])
def test_sizes_a_store_was_made_with(tmp_path: Path, data, index, want) -> None:
    files(tmp_path, DATA_DIR, *data)
    if index:
        files(tmp_path, INDEX_DIR, *index)
    configured = {"data_file_size": 1024 * MIB, "index_file_size": 160 * MIB}
    assert existing_file_sizes(tmp_path, configured) == want


def test_default_sizes_follow_the_store_and_a_contradicting_flag_is_a_problem(tmp_path: Path) -> None:
    files(tmp_path, DATA_DIR, (0, 64 * MIB))
    cfg = NodeConfig(id="n0", peers="n0-127.0.0.1:20911", store_dir=str(tmp_path))
    got, sources, problems = adopt_store_file_sizes(cfg, {"data_file_size": "default"})
    assert (got.data_file_size, sources["data_file_size"], problems) == (64 * MIB, "store", [])
    _, _, problems = adopt_store_file_sizes(cfg, {"data_file_size": "flag"})
    assert len(problems) == 1 and "created with 67108864-byte files" in problems[0]
