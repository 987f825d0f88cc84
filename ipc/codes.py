"""Every number that travels on the wire with a meaning: response codes, vote results, roles.

One module so the client, the node roles and the CLI agree. The response-code numbers are
DLedger's ``DLedgerResponseCode`` (docs/client.md "Errors: definite or indeterminate") and must
never be renumbered: users read them in logs and compare them with DLedger's documentation.
``VoteResult`` and ``ParseResult`` are DLedger's ``VoteResponse.RESULT`` /
``VoteResponse.ParseResult`` in declaration order.

``Role`` here is the canonical role enum (CANDIDATE=0, FOLLOWER=1, LEADER=2) used by the
election core and the wire (METADATA); other modules should import it from here.
"""

from __future__ import annotations

from enum import IntEnum


class ResponseCode(IntEnum):
    """DLedgerResponseCode, with DLedger's numbers (never renumbered)."""

    UNKNOWN = -1
    SUCCESS = 200
    TIMEOUT = 300
    METADATA_ERROR = 301
    NETWORK_ERROR = 302
    UNSUPPORTED = 303
    UNKNOWN_GROUP = 400
    UNKNOWN_MEMBER = 401
    UNEXPECTED_MEMBER = 402
    EXPIRED_TERM = 403
    NOT_LEADER = 404
    NOT_FOLLOWER = 405
    INCONSISTENT_STATE = 406
    INCONSISTENT_TERM = 407
    INCONSISTENT_INDEX = 408
    INCONSISTENT_LEADER = 409
    INDEX_OUT_OF_RANGE = 410
    UNEXPECTED_ARGUMENT = 411
    REPEATED_PUSH = 413
    DISK_ERROR = 414
    DISK_FULL = 415
    TERM_NOT_READY = 416
    FALL_BEHIND_TOO_MUCH = 417
    TAKE_LEADERSHIP_FAILED = 418
    INDEX_LESS_THAN_LOCAL_BEGIN = 419
    REQUEST_WITH_EMPTY_BODYS = 420
    PUSH_REQUEST_IS_FULL = 421
    INTERNAL_ERROR = 500
    TERM_CHANGED = 501
    WAIT_QUORUM_ACK_TIMEOUT = 502
    LEADER_PENDING_FULL = 503
    ILLEGAL_MEMBER_STATE = 504
    LEADER_TRANSFERRING = 506
    # client sessions (node/core/sessions.py, docs/client.md "Sessions")
    SESSION_EXPIRED = 430  # the leader no longer knows the session: open a new one
    SESSION_SEQ_GAP = 431  # entries before this seq are missing: resend from the leader's last + 1
    SESSION_SEQ_INVALID = 432  # a request that straddles the session's last seq
    SESSION_SEQ_TOO_OLD = 433  # already written, but too long ago for its index to be known
    SESSION_LIMIT = 434  # this leader opened all the session ids its term allows
    STATE_MACHINE_ERROR = 440  # the state machine raised while answering a query
    PERMISSION_DENIED = 450  # the sender's key lacks the right for this request (not retried)
    # membership changes (node/core/membership.py, docs/membership.md "Refusals")
    MEMBER_EXISTS = 460  # the id or the address is already a member's
    LAST_VOTER = 461  # removing the only voter would leave no one to commit
    LEARNER_BEHIND = 462  # promote refused: the learner is not caught up (or not answering)
    MEMBERSHIP_CHANGE_IN_PROGRESS = 463  # the newest configuration is not committed yet
    MEMBERSHIP_NO_CHANGE = 464  # the configuration already is what the change asks for
    TOO_MANY_MEMBERS = 465  # the configuration would hold more members than there are slots

    @classmethod
    def name_of(cls, code: int) -> str:
        """Name for any int, including numbers this version does not know (logs, CLI errors)."""
        try:
            return cls(code).name
        except ValueError:
            return f"CODE_{code}"


# Codes after which the same request may simply be retried, possibly at another node, because
# the entry was definitely NOT stored (or the answer never came): leader moved, leader busy,
# transfer in progress, term being set up, transport trouble. The client retries them with backoff
# within the call's timeout (docs/client.md "Errors: definite or indeterminate").
_RETRYABLE = frozenset({
    ResponseCode.NOT_LEADER,
    ResponseCode.LEADER_TRANSFERRING,
    ResponseCode.LEADER_PENDING_FULL,
    ResponseCode.TIMEOUT,
    ResponseCode.NETWORK_ERROR,
    ResponseCode.TERM_NOT_READY,
})

# Codes after which an append may or may not be committed later (docs/client.md "Errors: definite or
# indeterminate"): the client must report them as indeterminate, never as "not written".
_INDETERMINATE = frozenset({
    ResponseCode.TIMEOUT,
    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
    ResponseCode.TERM_CHANGED,
})


def is_retryable(code: int) -> bool:
    """True if retrying (with backoff, maybe at another node) is the right reaction.

    TIMEOUT is both retryable and indeterminate: a retried append after a timeout may
    duplicate the entry, which the client documents.
    """
    return code in _RETRYABLE


def is_indeterminate(code: int) -> bool:
    """True if the outcome of an append is unknown (it may still commit)."""
    return code in _INDETERMINATE


class VoteResult(IntEnum):
    """DLedger's VoteResponse.RESULT, ordinal order (the wire carries the number)."""

    UNKNOWN = 0
    ACCEPT = 1
    REJECT_UNKNOWN_LEADER = 2
    REJECT_UNEXPECTED_LEADER = 3
    REJECT_EXPIRED_VOTE_TERM = 4
    REJECT_ALREADY_VOTED = 5
    REJECT_ALREADY_HAS_LEADER = 6
    REJECT_TERM_NOT_READY = 7
    REJECT_TERM_SMALL_THAN_LEDGER = 8
    REJECT_EXPIRED_LEDGER_TERM = 9
    REJECT_SMALL_LEDGER_END_INDEX = 10
    REJECT_TAKING_LEADERSHIP = 11


class ParseResult(IntEnum):
    """DLedger's VoteResponse.ParseResult: what a candidate does after tallying a vote round."""

    WAIT_TO_REVOTE = 0
    REVOTE_IMMEDIATELY = 1
    PASSED = 2
    WAIT_TO_VOTE_NEXT = 3


class Role(IntEnum):
    """Member role (MemberState.Role). Canonical definition; the wire carries the number."""

    CANDIDATE = 0
    FOLLOWER = 1
    LEADER = 2


__all__ = [
    "ParseResult",
    "ResponseCode",
    "Role",
    "VoteResult",
    "is_indeterminate",
    "is_retryable",
]


class MsgType(IntEnum):
    """The first byte of every frame (ipc/protocol.py): a request, or its reply (request | 0x80).
    Here, with the other wire numbers, so the block's request counters name types without
    importing the codec."""

    APPEND = 1
    BATCH_APPEND = 2
    GET = 3
    METADATA = 4
    LEADERSHIP_TRANSFER = 5
    PUSH = 6
    VOTE = 7
    HEARTBEAT = 8
    TAKE_LEADERSHIP = 9
    MULTI = 10
    OPEN_SESSION = 11
    QUERY = 12
    SNAPSHOT = 13
    READ_INDEX = 14
    FETCH = 15
    MEMBER_CHANGE = 16
    INSTALL = 20
    APPEND_RESPONSE = 0x81
    BATCH_APPEND_RESPONSE = 0x82
    GET_RESPONSE = 0x83
    METADATA_RESPONSE = 0x84
    TRANSFER_RESPONSE = 0x85
    PUSH_RESPONSE = 0x86
    VOTE_RESPONSE = 0x87
    HEARTBEAT_RESPONSE = 0x88
    TAKE_LEADERSHIP_RESPONSE = 0x89
    MULTI_RESPONSE = 0x8A
    OPEN_SESSION_RESPONSE = 0x8B
    QUERY_RESPONSE = 0x8C
    SNAPSHOT_RESPONSE = 0x8D
    READ_INDEX_RESPONSE = 0x8E
    FETCH_RESPONSE = 0x8F
    INSTALL_RESPONSE = 0x94
    ERROR_RESPONSE = 0xFF
