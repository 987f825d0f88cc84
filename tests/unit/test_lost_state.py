"""decide_lost_state (node/core/lost_state.py): when a member that lost its term/vote state
knows enough to vote again, and when an empty member is in a brand-new group."""

from node.core.lost_state import PeerTerm, answers_needed, decide_lost_state, vote_floor_met


def a(peer, term, end=-1, committed=-1):
    return PeerTerm(peer, term, end, committed)


def test_answers_needed_intersect_every_majority_without_me():
    # n - majority + 1 others: with the majority's other members (majority - 1 of them) they
    # are more than the n - 1 others, so they share one.
    assert [answers_needed(n) for n in (1, 2, 3, 4, 5, 7)] == [1, 1, 2, 2, 3, 4]


def test_damaged_file_waits_for_enough_answers_then_takes_the_highest_term():
    kw = dict(file_absent=False, local_empty=False, local_end_term=3)
    assert decide_lost_state(3, [a("n1", 9, 50)], **kw) is None
    d = decide_lost_state(3, [a("n1", 9, 50), a("n2", 11, 40)], **kw)
    assert (d.new_group, d.term, d.catch_up) == (False, 11, -1)


def test_brand_new_group_needs_every_majority_heard_or_a_majority_with_me_after_the_wait():
    """All in term 0 with empty logs. `n - majority + 1` answers intersect every majority: a new
    group at once. A majority with this node (one member down at creation) only after
    NEW_GROUP_PATIENCE_MS: before it, the silent member may be the one that holds the log."""
    kw = dict(file_absent=True, local_empty=True, local_end_term=-1)
    assert decide_lost_state(3, [a("n1", 0), a("n2", 0)], **kw).new_group
    assert decide_lost_state(3, [a("n1", 0)], **kw) is None
    assert decide_lost_state(3, [a("n1", 0)], **kw, patience_over=True).new_group
    assert decide_lost_state(5, [a("n1", 0), a("n2", 0)], **kw) is None
    assert decide_lost_state(5, [a("n1", 0), a("n2", 0)], **kw, patience_over=True).new_group
    assert decide_lost_state(5, [a("n1", 0)], **kw, patience_over=True) is None
    assert decide_lost_state(5, [a("n1", 0), a("n2", 0), a("n3", 0)], **kw).new_group
    assert decide_lost_state(1, [], **kw).new_group


def test_lost_disk_is_any_history_and_catches_up_to_the_highest_end():
    kw = dict(file_absent=True, local_empty=True, local_end_term=-1)
    assert decide_lost_state(3, [a("n1", 4, 120)], **kw) is None  # history: wait for the rest
    d = decide_lost_state(3, [a("n1", 4, 120, 118), a("n2", 0, -1)], **kw)
    assert (d.new_group, d.term, d.catch_up) == (False, 4, 120)


def test_before_it_caught_up_a_lost_disk_votes_only_for_a_log_reaching_the_most_up_to_date_one_heard():
    """The floor is the most up to date log the answers report, in Raft's order (last term
    first): a candidate at or above it is at least as up to date as the answerer that holds
    every entry this node may have stored, and that answerer reaches it. The catch-up index is
    still the highest end heard (a longer log of an older term)."""
    d = decide_lost_state(3, [PeerTerm("n1", 4, 120, 118, 3), PeerTerm("n2", 4, 130, 100, 2)],
                          file_absent=True, local_empty=True, local_end_term=-1)
    assert (d.term, d.catch_up, d.floor) == (4, 130, (3, 120))
    assert vote_floor_met(3, 120, d.floor) and vote_floor_met(4, 0, d.floor)
    assert not vote_floor_met(3, 119, d.floor) and not vote_floor_met(2, 500, d.floor)


def test_the_floor_of_a_group_in_a_term_without_a_leader_is_a_log_that_exists():
    """The simulator's lost-disk fault, seed 2,702: the group was in term 2, entered by
    candidates only, and every log ended in term 1. A floor of (the group's term, the highest
    end) no log could reach: with two members catching up, the one that held the entries
    never got a vote. The answers' last entries give (1, 1), which it holds."""
    d = decide_lost_state(3, [PeerTerm("n0", 2, 1, 1, 1), PeerTerm("n1", 0, -1, -1, -1)],
                          file_absent=True, local_empty=True, local_end_term=-1)
    assert (d.term, d.catch_up, d.floor) == (2, 1, (1, 1))


def test_a_member_that_does_not_say_its_last_term_is_bounded_by_its_current_term():
    """An older version answers METADATA without the last entry's term: its current term
    stands in (never below the real one); an empty log is below everything."""
    d = decide_lost_state(3, [a("n1", 5, 7, 7), a("n2", 5, -1)], file_absent=True,
                          local_empty=True, local_end_term=-1)
    assert d.floor == (5, 7)
    assert a("n2", 9, -1).log_bound() == (-1, -1)


def test_absent_file_with_a_log_is_lost_state_not_a_new_node():
    d = decide_lost_state(3, [a("n1", 0), a("n2", 0)], file_absent=True, local_empty=False,
                          local_end_term=2)
    assert (d.new_group, d.term, d.catch_up) == (False, 2, -1)


def test_single_member_uses_its_log_term():
    d = decide_lost_state(1, [], file_absent=False, local_empty=False, local_end_term=6)
    assert (d.new_group, d.term) == (False, 6)


def test_a_new_member_hearing_a_first_election_under_way_votes_after_its_terms():
    """Three new members, one down: the first to decide is already a candidate in term 1 when
    the second asks. No log anywhere: after the wait the second skips term 1 and votes from
    term 2 on, instead of waiting for the member that is down (the group could never elect)."""
    kw = dict(file_absent=True, local_empty=True, local_end_term=-1)
    d = decide_lost_state(3, [PeerTerm("n0", 1, -1, -1)], **kw, patience_over=True)
    assert d is not None and (d.new_group, d.term, d.catch_up) == (False, 1, -1)
    # a log anywhere is history: a lost disk, which needs enough answers to bound its terms
    assert decide_lost_state(3, [PeerTerm("n0", 1, 0, 0)], file_absent=True, local_empty=True,
                             local_end_term=-1, patience_over=True) is None


def test_a_lost_disk_hearing_first_a_member_that_never_got_an_entry_waits_for_the_others():
    """The simulator's lost-disk fault (seed 69): the leader lost its disk; the member that
    answered first was cut off while the group wrote (term 1, no log). Taken for a new group at
    once, the two empty members elected a leader without the committed entries. Before the
    wait is over the node needs the answer of the member that holds the log."""
    kw = dict(file_absent=True, local_empty=True, local_end_term=-1)
    assert decide_lost_state(3, [a("n2", 1)], **kw) is None
    d = decide_lost_state(3, [a("n2", 1), a("n1", 1, 44, 44)], **kw)
    assert (d.new_group, d.term, d.catch_up) == (False, 1, 44)
