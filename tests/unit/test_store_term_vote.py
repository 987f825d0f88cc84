"""A damaged term/vote file refuses to load, naming the file; only an absent file is a new node.

Loading a damaged `currterm` as "term 0, no vote" would let a node vote twice in a term it
already voted in (and the elector used to crash with a traceback on every restart on a file
that was not UTF-8). The elector turns TermFileDamaged into a fatal stop.
"""

from __future__ import annotations

import pytest

from node.store.layout import LayoutError, read_properties
from node.store.term_vote import TermFileDamaged, TermVote, TermVoteFile


@pytest.mark.parametrize("content,why", [
    (b"\xff\xfe\x00garbage", "not valid UTF-8"),
    (b"currTerm=3\nvoteLeader=n1\n\xe9\n", "not valid UTF-8"),
    (b"", "empty"),
    (b"hello world\n", "no currTerm= / voteLeader= line"),
    (b"voteLeader=n1\n", "no currTerm= line"),
    (b"currTerm=4\n", "no voteLeader= line"),
    (b"currTerm=four\nvoteLeader=\n", "not a non-negative integer"),
    (b"currTerm=-2\nvoteLeader=\n", "not a non-negative integer"),
    (b"currTerm=\nvoteLeader=\n", "not a non-negative integer"),
    (b"currTerm=3\nvoteLeader=\ncatchUpIndex=x\n", "catchUpIndex='x' is not an integer"),
    (b"currTerm=3\nvoteLeader=\ncatchUpIndex=9\nvoteFloorTerm=3a\nvoteFloorIndex=9\n", "are not integers"),
    (b"currTerm=3\nvoteLeader=\ncatchUpIndex=9\nvoteFloorTerm=3\n", "are not integers"),
])
def test_a_damaged_term_file_refuses_to_load_naming_the_file(tmp_path, content, why):
    (tmp_path / "currterm").write_bytes(content)
    with pytest.raises(TermFileDamaged, match=why) as ei:
        TermVoteFile(tmp_path)
    assert str(tmp_path / "currterm") in str(ei.value)
    assert isinstance(ei.value, LayoutError)


def test_an_absent_term_file_is_a_new_node(tmp_path):
    assert TermVoteFile(tmp_path).current == TermVote(0, None)


def test_a_saved_term_file_round_trips(tmp_path):
    TermVoteFile(tmp_path).save(7, "n2")
    assert TermVoteFile(tmp_path).current == TermVote(7, "n2")
    TermVoteFile(tmp_path).save(8, None)
    assert TermVoteFile(tmp_path).current == TermVote(8, None)


def test_a_catch_up_and_its_term_are_kept_by_later_saves_and_cleared_together(tmp_path):
    TermVoteFile(tmp_path).save(4, "<lost>", catch_up=120, floor=(3, 118))
    assert TermVoteFile(tmp_path).current == TermVote(4, "<lost>", 120, (3, 118))
    TermVoteFile(tmp_path).save(5, "n1")  # a vote while catching up keeps both
    props = read_properties(tmp_path / "currterm")
    assert (props["catchUpIndex"], props["voteFloorTerm"], props["voteFloorIndex"]) == ("120", "3", "118")
    assert TermVoteFile(tmp_path).current == TermVote(5, "n1", 120, (3, 118))
    TermVoteFile(tmp_path).save(5, "n1", catch_up=-1)
    assert TermVoteFile(tmp_path).current == TermVote(5, "n1")
    assert not {"catchUpIndex", "voteFloorTerm", "voteFloorIndex"} & set(read_properties(tmp_path / "currterm"))


def test_dledger_written_term_file_with_comments_loads(tmp_path):
    (tmp_path / "currterm").write_text("#Mon Nov 23 11:00:00 UTC 2026\ncurrTerm=12\nvoteLeader=n0\n")
    assert TermVoteFile(tmp_path).current == TermVote(12, "n0")


def test_read_properties_names_a_file_that_is_not_utf8(tmp_path):
    (tmp_path / "checkpoint").write_bytes(b"committedIndex=\xff\n")
    with pytest.raises(LayoutError, match="checkpoint: not valid UTF-8"):
        read_properties(tmp_path / "checkpoint")
    assert read_properties(tmp_path / "absent") == {}
