"""node/core/membership.py: the configuration, its entry, which one is in force, and the rules of
a change (docs/membership.md). Table tests over `check_change`, properties over random
configurations and logs, and the three shapes of the 2015 single-server-change bug."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipc.codes import ResponseCode as RC
from ipc.entry_codec import MAGIC_NOOP, MAGIC_NORMAL
from node.core.membership import (
    CONFIG_TAG,
    MAX_MEMBERS,
    CatchUp,
    Change,
    ChangeKind,
    ConfigHistory,
    Configuration,
    ConfigurationError,
    LeaderState,
    LearnerProgress,
    Member,
    apply_change,
    bootstrap_configuration,
    caught_up,
    check_change,
    decode_configuration,
    encode_configuration,
    latest_configuration,
    leader_steps_down,
)

KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # 40 Z85 characters


def member(i: str, voter: bool = True, port: int | None = None) -> Member:
    return Member(i, "127.0.0.1", port if port is not None else 20000 + 2 * (ord(i[-1]) % 100), voter)


def config(voters: str, learners: str = "", index: int = -1) -> Configuration:
    return Configuration(tuple(member(v) for v in voters) + tuple(member(x, False) for x in learners), index)


READY = LeaderState(term_first_index=10, committed_index=10)  # its NOOP (10) committed
CAUGHT = LearnerProgress(match_index=99, match_end_pos=9_000, alive=True, leader_end_index=100,
                         leader_end_pos=9_100)


@dataclass
class E:  # an entry as the store gives it (index, magic, body)
    index: int
    magic: int
    body: bytes


def cfg_entry(c: Configuration, index: int) -> E:
    return E(index, MAGIC_NOOP, encode_configuration(c))


# --------------------------------------------------------------------------------------------
# check_change: every refusal docs/membership.md lists
# --------------------------------------------------------------------------------------------
ADD_E = Change(ChangeKind.ADD_LEARNER, "e", "127.0.0.1", 20301)

CASES = [
    # (name, current, change, leader, progress, expected)
    ("add a learner", config("abc", index=5), ADD_E, READY, None, RC.SUCCESS),
    ("add to a bootstrap configuration", config("abc"), ADD_E, READY, None, RC.SUCCESS),
    ("add an existing voter's id", config("abc", index=5),
     Change(ChangeKind.ADD_LEARNER, "a", "127.0.0.1", 20999), READY, None, RC.MEMBER_EXISTS),
    ("add an existing address", config("abc", index=5),
     Change(ChangeKind.ADD_LEARNER, "e", *member("a").address), READY, None, RC.MEMBER_EXISTS),
    ("add the same learner again", config("abc", "e", index=5),
     Change(ChangeKind.ADD_LEARNER, "e", *member("e").address), READY, None,
     RC.MEMBERSHIP_NO_CHANGE),
    ("add a learner's id at another address", config("abc", "e", index=5),
     Change(ChangeKind.ADD_LEARNER, "e", "127.0.0.1", 20999), READY, None, RC.MEMBER_EXISTS),
    ("add a bad id", config("abc", index=5),
     Change(ChangeKind.ADD_LEARNER, "e-1", "127.0.0.1", 20999), READY, None, RC.UNEXPECTED_ARGUMENT),
    ("add a bad port", config("abc", index=5),
     Change(ChangeKind.ADD_LEARNER, "e", "127.0.0.1", 65535), READY, None, RC.UNEXPECTED_ARGUMENT),
    ("add a bad key", config("abc", index=5),
     Change(ChangeKind.ADD_LEARNER, "e", "127.0.0.1", 20999, "short"), READY, None,
     RC.UNEXPECTED_ARGUMENT),
    ("add past the slots", Configuration(tuple(Member(f"n{i}", "h", 1000 + 2 * i) for i in range(MAX_MEMBERS)), 5),
     ADD_E, READY, None, RC.TOO_MANY_MEMBERS),
    ("promote a caught-up learner", config("abc", "e", index=5),
     Change(ChangeKind.PROMOTE, "e"), READY, CAUGHT, RC.SUCCESS),
    ("promote without progress", config("abc", "e", index=5),
     Change(ChangeKind.PROMOTE, "e"), READY, None, RC.LEARNER_BEHIND),
    ("promote a lagging learner (entries)", config("abc", "e", index=5),
     Change(ChangeKind.PROMOTE, "e"), READY, LearnerProgress(10, 9_000, True, 1_100, 9_100), RC.LEARNER_BEHIND),
    ("promote a lagging learner (bytes)", config("abc", "e", index=5),
     Change(ChangeKind.PROMOTE, "e"), READY, LearnerProgress(99, 0, True, 100, 9 << 20), RC.LEARNER_BEHIND),
    ("promote a silent learner", config("abc", "e", index=5),
     Change(ChangeKind.PROMOTE, "e"), READY, LearnerProgress(99, 9_000, False, 100, 9_100), RC.LEARNER_BEHIND),
    ("promote a voter", config("abc", index=5), Change(ChangeKind.PROMOTE, "a"), READY, CAUGHT,
     RC.MEMBERSHIP_NO_CHANGE),
    ("promote an unknown id", config("abc", index=5), Change(ChangeKind.PROMOTE, "z"), READY, CAUGHT,
     RC.UNKNOWN_MEMBER),
    ("remove a voter", config("abc", index=5), Change(ChangeKind.REMOVE, "c"), READY, None, RC.SUCCESS),
    ("remove the leader itself", config("abc", index=5), Change(ChangeKind.REMOVE, "a"), READY, None,
     RC.SUCCESS),
    ("remove a learner", config("a", "e", index=5), Change(ChangeKind.REMOVE, "e"), READY, None, RC.SUCCESS),
    ("remove the last voter", config("a", "e", index=5), Change(ChangeKind.REMOVE, "a"), READY, None,
     RC.LAST_VOTER),
    ("remove an unknown id", config("abc", index=5), Change(ChangeKind.REMOVE, "z"), READY, None,
     RC.UNKNOWN_MEMBER),
    ("a change while one is in flight", config("abc", index=11), Change(ChangeKind.REMOVE, "c"),
     LeaderState(10, 10), None, RC.MEMBERSHIP_CHANGE_IN_PROGRESS),
    ("in flight beats a no-op", config("abc", index=11), Change(ChangeKind.PROMOTE, "a"),
     LeaderState(10, 10), None, RC.MEMBERSHIP_CHANGE_IN_PROGRESS),
    ("no commit of the leader's own term", config("abc", index=5), Change(ChangeKind.REMOVE, "c"),
     LeaderState(10, 9), None, RC.TERM_NOT_READY),
    ("no NOOP written yet", config("abc", index=5), Change(ChangeKind.REMOVE, "c"),
     LeaderState(-1, 9), None, RC.TERM_NOT_READY),
]


@pytest.mark.parametrize("name,current,change,leader,progress,expected", CASES, ids=[c[0] for c in CASES])
def test_check_change_table(name, current, change, leader, progress, expected):
    assert check_change(current, change, leader, progress) == expected


def test_every_new_code_is_reached_by_the_table():
    reached = {c[-1] for c in CASES}
    for code in (RC.MEMBER_EXISTS, RC.LAST_VOTER, RC.LEARNER_BEHIND, RC.MEMBERSHIP_CHANGE_IN_PROGRESS,
                 RC.MEMBERSHIP_NO_CHANGE, RC.TOO_MANY_MEMBERS, RC.UNKNOWN_MEMBER, RC.TERM_NOT_READY):
        assert code in reached, code.name


def test_catch_up_is_a_distance_not_a_ratio():
    rule = CatchUp(max_entries=1000, max_bytes=8 << 20)
    gib = 1 << 30
    # 95% of a 1 GiB log is still 50 MiB away: not caught up (a 90% rule would say yes)
    assert not caught_up(LearnerProgress(950_000, gib * 95 // 100, True, 1_000_000, gib), rule)
    # the last 500 entries (500 KiB) of a log that keeps growing: caught up
    assert caught_up(LearnerProgress(999_500, gib - (500 << 10), True, 1_000_000, gib), rule)
    # exactly at the bound counts; one past does not
    assert caught_up(LearnerProgress(0, 0, True, 1000, 8 << 20), rule)
    assert not caught_up(LearnerProgress(0, 0, True, 1001, 0), rule)
    assert not caught_up(LearnerProgress(0, 0, True, 0, (8 << 20) + 1), rule)


def test_apply_change_results():
    c = config("abc", index=5)
    added = apply_change(c, ADD_E, 12)
    assert (added.voters, added.learners, added.index) == (("a", "b", "c"), ("e",), 12)
    promoted = apply_change(added, Change(ChangeKind.PROMOTE, "e"), 14)
    assert (promoted.voters, promoted.learners) == (("a", "b", "c", "e"), ())
    removed = apply_change(promoted, Change(ChangeKind.REMOVE, "a"), 16)
    assert removed.voters == ("b", "c", "e")
    with pytest.raises(ConfigurationError):
        apply_change(c, Change(ChangeKind.REMOVE, "z"), 6)
    with pytest.raises(ConfigurationError):
        apply_change(config("a"), Change(ChangeKind.REMOVE, "a"), 6)


def test_quorum_counts_voters_only():
    c = config("abc", "de")
    assert c.quorum_size == 2
    assert not c.is_quorum(["a", "d", "e", "z"])
    assert c.is_quorum(["a", "b", "d"])
    assert c.quorum_index({"a": 9, "b": 7, "c": 3, "d": 100, "e": 100}) == 7
    assert c.quorum_index({"a": 9}) == -1  # missing voters count as -1
    assert config("abcd").quorum_index({"a": 9, "b": 8, "c": 7, "d": 6}) == 7  # 3 of 4 hold 7


def test_removed_leader_steps_down_only_once_the_change_commits():
    c = config("bc", index=20)  # a was the leader and is gone
    assert not leader_steps_down("a", c, committed_index=19)
    assert leader_steps_down("a", c, committed_index=20)
    assert not leader_steps_down("b", c, committed_index=20)


def test_bootstrap_from_peers():
    c = bootstrap_configuration("n0-127.0.0.1:20911;n1-127.0.0.1:20913", {"n1": KEY})
    assert (c.voters, c.learners, c.index) == (("n0", "n1"), (), -1)
    assert c.member("n1").public_key == KEY
    assert c.peers_string() == "n0-127.0.0.1:20911;n1-127.0.0.1:20913"
    with pytest.raises(ConfigurationError, match="expected ID-HOST:PORT"):
        bootstrap_configuration("garbage")


@pytest.mark.parametrize("members,msg", [
    ((), "at least one voter"),
    ((Member("a", "h", 1, False),), "at least one voter"),
    ((Member("a", "h", 1), Member("a", "h", 3)), "appears twice"),
    ((Member("a", "h", 1), Member("b", "h", 1)), "appears twice"),
    ((Member("", "h", 1),), "member id"),
    ((Member("a-b", "h", 1),), "member id"),
    ((Member("a", "", 1),), "host"),
    ((Member("a", "h", 0),), "port"),
    ((Member("a", "h", 1, True, "x" * 39),), "public key"),
])
def test_bad_configurations_are_refused(members, msg):
    with pytest.raises(ConfigurationError, match=msg):
        Configuration(members)


# --------------------------------------------------------------------------------------------
# The entry: round trip and garbage
# --------------------------------------------------------------------------------------------
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.é", min_size=1, max_size=20)  # no "_": "zz_new" is free


@st.composite
def configurations(draw, max_members: int = MAX_MEMBERS, min_voters: int = 1):
    n = draw(st.integers(min_voters, max_members))
    names = draw(st.lists(ids, min_size=n, max_size=n, unique=True))
    voters = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    voters[0] = True
    hosts = draw(st.lists(st.sampled_from(["127.0.0.1", "::1", "db-7.example.org"]), min_size=n, max_size=n))
    keys = draw(st.lists(st.sampled_from(["", KEY]), min_size=n, max_size=n))
    ms = tuple(Member(i, h, 1 + 2 * k, v, key) for k, (i, h, v, key) in enumerate(zip(names, hosts, voters, keys, strict=True)))
    return Configuration(ms, draw(st.integers(-1, 10**12)))


@given(configurations())
def test_encode_decode_round_trip(c):
    body = encode_configuration(c)
    assert body.startswith(CONFIG_TAG)
    assert decode_configuration(body, c.index) == c
    assert decode_configuration(memoryview(body), c.index) == c


@settings(max_examples=300)
@given(configurations(), st.data())
def test_damaged_bodies_raise_only_configuration_error(c, data):
    body = bytearray(encode_configuration(c))
    how = data.draw(st.sampled_from(["cut", "flip", "extend"]))
    if how == "cut":
        body = body[:data.draw(st.integers(0, len(body) - 1))]
    elif how == "flip":
        body[data.draw(st.integers(0, len(body) - 1))] ^= data.draw(st.integers(1, 255))
    else:
        body += data.draw(st.binary(min_size=1, max_size=8))
    try:
        got = decode_configuration(bytes(body), 7)
    except ConfigurationError as e:
        assert str(e).startswith("configuration entry 7: ")
        assert "\n" not in str(e)
    else:  # a flip inside a name or port can still be a valid configuration: then it is a new one
        assert how == "flip" and got != c


@given(st.binary(max_size=200))
def test_garbage_raises_only_configuration_error(b):
    try:
        decode_configuration(b, 3)
    except ConfigurationError:
        pass


@pytest.mark.parametrize("body,msg", [
    (b"", "shorter than"),
    (b"DLCX\x01\x00\x01", "tag"),
    (b"DLCF\x02\x00\x01", "version 2"),
    (b"DLCF\x01\x00\x00", "at least one voter"),
    (b"DLCF\x01\x00\x11", "17 members"),
    (b"DLCF\x01\x00\x01\x03", "flags"),
    (b"DLCF\x01\x00\x01\x01\x05ab", "truncated"),
    (b"DLCF\x01\x00\x01\x01\x01\xff\x01h\x00\x01\x00", "bad utf-8"),
])
def test_specific_garbage_messages(body, msg):
    with pytest.raises(ConfigurationError, match=msg):
        decode_configuration(body, 0)


def test_trailing_bytes_refused():
    with pytest.raises(ConfigurationError, match="after the last member"):
        decode_configuration(encode_configuration(config("ab")) + b"\x00", 0)


# --------------------------------------------------------------------------------------------
# Which configuration is in force: the newest entry, committed or not
# --------------------------------------------------------------------------------------------
def test_latest_skips_normal_entries_and_the_terms_noop():
    base = config("abc")
    c1 = config("abc", "d")
    log = [E(0, MAGIC_NOOP, b""), E(1, MAGIC_NORMAL, b"DLCF-user-data"), cfg_entry(c1, 2),
           E(3, MAGIC_NORMAL, b"x")]
    assert latest_configuration(log, base) == c1.with_index(2)
    assert latest_configuration(log[:2], base) == base


def test_latest_prefers_a_newer_snapshot_base():
    snap = config("ab", index=50)
    assert latest_configuration([cfg_entry(config("abc"), 10)], snap) == snap
    assert latest_configuration([cfg_entry(config("abc"), 60)], snap).index == 60


def test_latest_refuses_a_damaged_entry():
    with pytest.raises(ConfigurationError, match="configuration entry 4"):
        latest_configuration([E(4, MAGIC_NOOP, b"DLCF\x09")], config("a"))


ops = st.lists(st.one_of(
    st.tuples(st.just("normal"), st.integers(0, 0)),
    st.tuples(st.just("noop"), st.integers(0, 0)),
    st.tuples(st.just("config"), st.integers(0, 5)),
    st.tuples(st.just("truncate"), st.integers(0, 30)),
    st.tuples(st.just("snapshot"), st.integers(0, 30)),
), max_size=40)


@settings(max_examples=300)
@given(ops)
def test_history_follows_appends_and_truncations(seq):
    """After any appends and truncations (and snapshots), the newest configuration entry still
    in the log wins, both by a full scan and by the incremental `ConfigHistory`."""
    base = config("abc")
    pool = [config("abc", "d"), config("abcd"), config("bcd"), config("bcd", "e"), config("bcde"),
            config("a")]
    log: list[E] = []
    snap_base = base
    hist = ConfigHistory(base)
    for op, arg in seq:
        if op == "normal":
            log.append(E(len(log), MAGIC_NORMAL, b"body"))
        elif op == "noop":
            log.append(E(len(log), MAGIC_NOOP, b""))
        elif op == "config":
            log.append(cfg_entry(pool[arg], len(log)))
        elif op == "truncate":
            cut = max(min(arg, len(log)), snap_base.index + 1)  # never below a snapshot
            del log[cut:]
            hist.truncated(cut)
        elif op == "snapshot" and log and arg < len(log):
            snap_base = latest_configuration(log[:arg + 1], snap_base)
            hist.compacted(snap_base)
        if op in ("normal", "noop", "config"):
            e = log[-1]
            hist.appended(e.index, e.magic, e.body)
        newest = [e for e in log if e.magic == MAGIC_NOOP and e.body and e.index > snap_base.index]
        want = decode_configuration(newest[-1].body, newest[-1].index) if newest else snap_base
        assert latest_configuration(log, snap_base) == want
        assert hist.latest == want


# --------------------------------------------------------------------------------------------
# Safety: one accepted change never splits the majorities
# --------------------------------------------------------------------------------------------
def majorities(c: Configuration) -> list[frozenset[str]]:
    """Every minimal set of ids `c.is_quorum` accepts (enumerated: voters <= MAX_MEMBERS)."""
    v = c.voters
    return [frozenset(s) for s in combinations(v, c.quorum_size) if c.is_quorum(s)]


def disjoint_majorities(a: Configuration, b: Configuration) -> tuple[frozenset, frozenset] | None:
    for ma in majorities(a):
        for mb in majorities(b):
            if not ma & mb:
                return ma, mb
    return None


@settings(max_examples=300)
@given(configurations(max_members=7), configurations(max_members=7))
def test_majorities_intersect_agrees_with_enumerating_them(a, b):
    """The simulator's check (`majorities_intersect`, by counting) against the definition."""
    from node.core.membership import majorities_intersect

    assert majorities_intersect(a, b) == (disjoint_majorities(a, b) is None)


@settings(max_examples=300)
@given(configurations(max_members=9))
def test_one_accepted_change_keeps_majorities_intersecting(c):
    """Every change `check_change` accepts from `c` (all of them are tried: an add, and a
    promote and a remove of each member) leads to voters whose majorities meet c's."""
    leader = LeaderState(term_first_index=c.index + 1, committed_index=c.index + 1)
    changes = [Change(ChangeKind.ADD_LEARNER, "zz_new", "10.0.0.9", 40001)]
    changes += [Change(k, i) for i in c.ids for k in (ChangeKind.PROMOTE, ChangeKind.REMOVE)]
    accepted = 0
    for change in changes:
        if check_change(c, change, leader, CAUGHT) != RC.SUCCESS:
            continue
        accepted += 1
        after = apply_change(c, change, c.index + 2)
        assert disjoint_majorities(c, after) is None, (change, c.voters, after.voters)
    assert accepted >= 1  # at least the add, or removing a learner or one of several voters


# --------------------------------------------------------------------------------------------
# The 2015 single-server-change bug, its three shapes, from a 4-node group
# --------------------------------------------------------------------------------------------
# Leader L1 (term 1) appends change X to C0 and crashes before X commits; L2 (term 2) never saw
# X, appends change Y to C0. Without the own-term-commit rule X and Y each pass every other
# check, yet a majority of C0+X and a majority of C0+Y can be disjoint: two leaders in one term,
# or Y committed by a majority that never stored X and X then overwriting it. "Add" is promote
# here (every add is add-as-learner, then promote), so C0 holds the learners e and f.
C0 = config("abcd", "ef", index=4)
SHAPES = {
    "two adds": (Change(ChangeKind.PROMOTE, "e"), Change(ChangeKind.PROMOTE, "f")),
    "add and remove": (Change(ChangeKind.PROMOTE, "e"), Change(ChangeKind.REMOVE, "d")),
    "two removes": (Change(ChangeKind.REMOVE, "a"), Change(ChangeKind.REMOVE, "d")),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_2015_bug_two_changes_to_one_old_configuration_split_the_majorities(shape):
    x, y = SHAPES[shape]
    # each alone is a fine single change (by a leader whose term has committed)
    assert check_change(C0, x, LeaderState(5, 5), CAUGHT) == RC.SUCCESS
    assert check_change(C0, y, LeaderState(6, 6), CAUGHT) == RC.SUCCESS
    cx, cy = apply_change(C0, x, 6), apply_change(C0, y, 7)
    assert disjoint_majorities(C0, cx) is None and disjoint_majorities(C0, cy) is None
    # but siblings are two changes apart, and their majorities can be disjoint
    split = disjoint_majorities(cx, cy)
    assert split is not None, (cx.voters, cy.voters)


@pytest.mark.parametrize("shape", SHAPES)
def test_2015_bug_check_change_refuses_the_second_change(shape):
    x, y = SHAPES[shape]
    cx = apply_change(C0, x, 6)  # L1 appended X at 6 (its NOOP was 5, committed)
    # L1 itself: X is not committed yet
    assert check_change(cx, y, LeaderState(5, 5), CAUGHT) == RC.MEMBERSHIP_CHANGE_IN_PROGRESS
    # L2 in term 2, whose log lacks X (its newest configuration is C0, committed at 4), wrote
    # its NOOP at 6 and nothing of its term is committed: refused. Once its NOOP commits on a
    # majority of C0, that majority meets every majority of C0+X, so X (an older term's entry
    # L2 does not hold) can never commit any more: then Y is safe.
    assert check_change(C0, y, LeaderState(6, 5), CAUGHT) == RC.TERM_NOT_READY
    assert check_change(C0, y, LeaderState(6, 6), CAUGHT) == RC.SUCCESS
    # and a leader that holds X uses it (newest, uncommitted) and waits for it to commit
    assert latest_configuration([cfg_entry(C0, 4), cfg_entry(cx, 6)], config("abcd")) == cx
    assert check_change(cx, y, LeaderState(7, 7), CAUGHT) == RC.SUCCESS
    cxy = apply_change(cx, y, 8)
    assert disjoint_majorities(cx, cxy) is None


# --------------------------------------------------------------------------------------------
# The counters take their voter set from a Configuration (static: identical behavior)
# --------------------------------------------------------------------------------------------
def test_elector_core_counts_the_voters_of_a_configuration():
    from node.core.election import ElectorCore

    static = ElectorCore("a", ["a", "b", "c"])
    boot = ElectorCore("a", bootstrap_configuration("a-127.0.0.1:1;b-127.0.0.1:3;c-127.0.0.1:5"))
    assert (boot.members, boot.others, boot._n) == (static.members, static.others, static._n)
    with_learners = ElectorCore("a", config("abc", "de"))
    assert (with_learners.members, with_learners.others, with_learners._n) == (("a", "b", "c"), ("b", "c"), 3)
    assert with_learners.beat_to == ("b", "c", "d", "e")  # learners hear heartbeats, never vote
    assert with_learners.stands
    learner = ElectorCore("d", config("abc", "de"))  # a learner (or a removed member) follows
    assert (learner.members, learner.stands) == (("a", "b", "c"), False)
    with pytest.raises(ValueError, match="not among the voters"):
        ElectorCore("d", ["a", "b", "c"])  # a plain list is the bootstrap: every member a voter


def test_ack_checker_watermarks_count_voters_only():
    from node.core.replication import current_term_watermarks, quorum_index, voter_slots

    c = config("abc", "de")  # slots 0..2 voters, 3..4 learners
    peers = [(0, 0), (7, 5), (3, 5), (100, 5), (100, 5)]
    marks = current_term_watermarks(5, 0, 9, peers, voter_slots(c))
    assert marks == [9, 7, 3]
    assert quorum_index(marks) == 7 == c.quorum_index({"a": 9, "b": 7, "c": 3, "d": 100, "e": 100})
    # a static group: the bootstrap configuration's slots are every slot, as without a set
    boot = config("abcde")
    assert current_term_watermarks(5, 0, 9, peers, voter_slots(boot)) == current_term_watermarks(5, 0, 9, peers)
    # a leader that removed itself (slot 0 not a voter) does not count its own log
    gone = Configuration(tuple(member(x, x != "a") for x in "abc"), 20)
    assert current_term_watermarks(5, 0, 9, peers[:3], voter_slots(gone)) == [7, 3]


def test_a_group_of_more_members_than_a_configuration_holds_is_refused_at_start(tmp_path):
    """The elector and the ack checker build the bootstrap configuration from --peers: a peers
    string past MAX_MEMBERS is one line from the config check, not a role crashing at start."""
    from node.config import ConfigError, NodeConfig
    from node.core.membership import MAX_MEMBERS

    peers = ";".join(f"n{i}-127.0.0.1:{20000 + 2 * i}" for i in range(MAX_MEMBERS + 1))
    with pytest.raises(ConfigError, match=f"at most {MAX_MEMBERS}"):
        NodeConfig(id="n0", peers=peers, store_dir=str(tmp_path / "s")).validate()
    ok = ";".join(f"n{i}-127.0.0.1:{20000 + 2 * i}" for i in range(MAX_MEMBERS))
    NodeConfig(id="n0", peers=ok, store_dir=str(tmp_path / "s")).validate()
