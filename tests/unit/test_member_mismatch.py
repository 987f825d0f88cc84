"""The elector's reports of members that disagree on the member set (node/roles/member_mismatch.py)."""

from __future__ import annotations

import logging

from ipc import protocol as P
from ipc.codes import ResponseCode
from node.roles.member_mismatch import REPORT_EVERY_MS, MemberMismatch, member_set_difference


def test_a_stranger_and_an_unknown_member_answer_are_reported_once_a_minute(caplog) -> None:
    m = MemberMismatch(logging.getLogger("t"), "n0", ["n0", "n1", "n2"])
    with caplog.at_level(logging.WARNING):
        m.on_request(P.VoteRequest("g", "n0", "n3", 5, 0, -1), 0)
        m.on_request(P.VoteRequest("g", "n0", "n3", 6, 0, -1), 1000)  # within the minute: quiet
        m.on_request(P.VoteRequest("g", "n0", "n1", 6, 0, -1), 1000)  # a member: nothing to say
        m.on_response(P.ErrorResponse(ResponseCode.UNKNOWN_MEMBER, "g", 3, "n2"), 2000)
        m.on_request(P.HeartbeatRequest("g", "n0", "n3", 7), REPORT_EVERY_MS + 1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "'n3', which is not a member here (members: n0, n1, n2)" in lines[0]
    assert "n2 does not count n0 as a member" in lines[1]
    assert lines[2].startswith("n0: a HEARTBEAT from 'n3'")


def test_member_set_difference_names_a_moved_member_or_a_set_without_this_node() -> None:
    ours = {"n0": ("h", 1), "n1": ("h", 3)}
    same = [P.PeerInfo("n0", "h:1", 0), P.PeerInfo("n1", "h:3", 0)]
    assert member_set_difference("n0", ours, "n1", same) is None
    # members added or removed online are no mistake: --peers is only a node's start
    grown = [*same, P.PeerInfo("n9", "h:9", 0)]
    assert member_set_difference("n0", ours, "n1", grown) is None
    assert member_set_difference("n0", ours, "n0", [same[0]]) is None
    moved = [P.PeerInfo("n0", "h:1", 0), P.PeerInfo("n1", "h:5", 0)]
    line = member_set_difference("n0", ours, "n1", moved)
    assert line is not None and "n1's members name n1 at h:5 (--peers here: h:3)" in line
    line = member_set_difference("n0", ours, "n1", [same[1], P.PeerInfo("n9", "h:9", 0)])
    assert line is not None and "does not hold this node (its members: n1, n9)" in line
