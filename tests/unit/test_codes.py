"""ipc.codes: the numbers are DLedger's and must never drift (docs/client.md "Errors: definite or
indeterminate")."""

import pytest

from ipc.codes import ParseResult, ResponseCode, Role, VoteResult, is_indeterminate, is_retryable

# "Response codes (DLedgerResponseCode, keep these numbers)", transcribed row by row.
SPEC_TABLE = {
    -1: "UNKNOWN", 200: "SUCCESS", 300: "TIMEOUT", 301: "METADATA_ERROR", 302: "NETWORK_ERROR",
    303: "UNSUPPORTED", 400: "UNKNOWN_GROUP", 401: "UNKNOWN_MEMBER", 402: "UNEXPECTED_MEMBER",
    403: "EXPIRED_TERM", 404: "NOT_LEADER", 405: "NOT_FOLLOWER", 406: "INCONSISTENT_STATE",
    407: "INCONSISTENT_TERM", 408: "INCONSISTENT_INDEX", 409: "INCONSISTENT_LEADER",
    410: "INDEX_OUT_OF_RANGE", 411: "UNEXPECTED_ARGUMENT", 413: "REPEATED_PUSH",
    414: "DISK_ERROR", 415: "DISK_FULL", 416: "TERM_NOT_READY", 417: "FALL_BEHIND_TOO_MUCH",
    418: "TAKE_LEADERSHIP_FAILED", 419: "INDEX_LESS_THAN_LOCAL_BEGIN",
    420: "REQUEST_WITH_EMPTY_BODYS", 421: "PUSH_REQUEST_IS_FULL", 500: "INTERNAL_ERROR",
    501: "TERM_CHANGED", 502: "WAIT_QUORUM_ACK_TIMEOUT", 503: "LEADER_PENDING_FULL",
    504: "ILLEGAL_MEMBER_STATE", 506: "LEADER_TRANSFERRING",
}


# Ours, beyond DLedger's (client sessions, docs/client.md "Sessions"; membership, docs/membership.md): numbers DLedger does not use.
OUR_CODES = {430: "SESSION_EXPIRED", 431: "SESSION_SEQ_GAP", 432: "SESSION_SEQ_INVALID",
             433: "SESSION_SEQ_TOO_OLD", 434: "SESSION_LIMIT", 440: "STATE_MACHINE_ERROR",
             450: "PERMISSION_DENIED", 460: "MEMBER_EXISTS", 461: "LAST_VOTER",
             462: "LEARNER_BEHIND", 463: "MEMBERSHIP_CHANGE_IN_PROGRESS",
             464: "MEMBERSHIP_NO_CHANGE", 465: "TOO_MANY_MEMBERS"}


def test_response_codes_are_exactly_the_spec_table_plus_ours():
    assert not SPEC_TABLE.keys() & OUR_CODES.keys()
    assert {c.value: c.name for c in ResponseCode} == SPEC_TABLE | OUR_CODES


@pytest.mark.parametrize("number,name", sorted(SPEC_TABLE.items()), ids=lambda x: str(x))
def test_each_code_number(number, name):
    assert ResponseCode[name] == number
    assert ResponseCode.name_of(number) == name


def test_name_of_unknown_number():
    assert ResponseCode.name_of(999) == "CODE_999"


def test_vote_and_parse_results_are_dledger_enums_in_order():
    # DLedger declares them in this order; the wire carries the ordinal.
    assert [v.name for v in VoteResult] == [
        "UNKNOWN", "ACCEPT", "REJECT_UNKNOWN_LEADER", "REJECT_UNEXPECTED_LEADER",
        "REJECT_EXPIRED_VOTE_TERM", "REJECT_ALREADY_VOTED", "REJECT_ALREADY_HAS_LEADER",
        "REJECT_TERM_NOT_READY", "REJECT_TERM_SMALL_THAN_LEDGER", "REJECT_EXPIRED_LEDGER_TERM",
        "REJECT_SMALL_LEDGER_END_INDEX", "REJECT_TAKING_LEADERSHIP"]
    assert [v.value for v in VoteResult] == list(range(12))
    assert [p.name for p in ParseResult] == [
        "WAIT_TO_REVOTE", "REVOTE_IMMEDIATELY", "PASSED", "WAIT_TO_VOTE_NEXT"]
    assert (Role.CANDIDATE, Role.FOLLOWER, Role.LEADER) == (0, 1, 2)


@pytest.mark.parametrize("code", ["NOT_LEADER", "LEADER_TRANSFERRING", "LEADER_PENDING_FULL",
                                  "TIMEOUT", "NETWORK_ERROR", "TERM_NOT_READY"])
def test_retryable(code):  # the client retries them with backoff inside its timeout
    assert is_retryable(ResponseCode[code])


@pytest.mark.parametrize("code", ["SUCCESS", "UNKNOWN_GROUP", "DISK_FULL", "INDEX_OUT_OF_RANGE",
                                  "REQUEST_WITH_EMPTY_BODYS", "WAIT_QUORUM_ACK_TIMEOUT",
                                  "TERM_CHANGED"])
def test_not_retryable(code):  # definite failures, or indeterminate (retry may duplicate)
    assert not is_retryable(ResponseCode[code])


def test_indeterminate_is_exactly_the_spec_set():
    # "Outcomes": WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED and client timeouts.
    assert {c for c in ResponseCode if is_indeterminate(c)} == {
        ResponseCode.TIMEOUT, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TERM_CHANGED}
