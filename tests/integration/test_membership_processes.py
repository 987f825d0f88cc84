"""Membership changes on a real group (docs/membership.md): real processes on 127.0.0.1, a
writer running throughout. Remove a voter (then stop it): the two that remain keep committing;
restart it, add it back as a learner, promote it once it caught up. Every acknowledged append
is in the log exactly once, at its index."""

import threading

from cluster import wait_for

from ipc.client import DLedgerError
from ipc.codes import ResponseCode as RC

ADD, PROMOTE, REMOVE = 1, 2, 3


def test_remove_a_voter_add_it_back_as_a_learner_and_promote_it_under_writes(make_cluster):
    c = make_cluster(3)
    lead = c.wait_leader(timeout=15)
    victim = next(x for x in c.nodes if x != lead)
    acked: dict[int, bytes] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        with c.client(timeout=20) as w:
            i = 0
            while not stop.is_set():
                body = b"w-%d" % i
                try:
                    acked[w.append(body).index] = body
                except DLedgerError as e:  # only an indeterminate answer may be lost here
                    if not e.indeterminate:
                        errors.append(e)
                i += 1

    t = threading.Thread(target=writer, name="writer")
    t.start()
    try:
        with c.client(timeout=20) as cl:
            wait_for(lambda: len(acked) >= 20, 20, "the writer commits")
            removed_at = cl.change_membership(REMOVE, victim)
            assert removed_at > 0

            def stored_its_removal() -> bool:  # an operator stops a removed node afterwards
                m = c.metadata(victim)
                return m is not None and m.ledger_end_index >= removed_at

            wait_for(stored_its_removal, 20, f"{victim} stores the entry that removes it")
            c.nodes[victim].kill()  # the group is now {lead, other}: both needed, and enough
            n0 = len(acked)
            wait_for(lambda: len(acked) >= n0 + 50, 20, "commits continue with two voters")
            # back, as a learner at its --peers address, then promoted once caught up
            c.nodes[victim].start()
            cl.change_membership(ADD, victim, "127.0.0.1", c.nodes[victim].port)

            def promoted() -> bool:
                try:
                    cl.change_membership(PROMOTE, victim)
                except DLedgerError as e:  # not caught up yet: asked again
                    assert e.code in (RC.LEARNER_BEHIND, RC.MEMBERSHIP_CHANGE_IN_PROGRESS), e
                    return False
                return True

            wait_for(promoted, 30, "the learner caught up and was promoted", interval=0.1)
            # the restarted member read its configuration (removed) from DIR/configuration
            assert f"configuration of entry {removed_at}" in c.nodes[victim].log_text()
            with_it = len(acked)
            wait_for(lambda: len(acked) >= with_it + 50, 20, "commits continue with three voters")
            # a change naming a member's address for another id is refused, nothing changes
            try:
                cl.change_membership(ADD, "n9", "127.0.0.1", c.nodes[lead].port)
                raise AssertionError("a second member at a member's address was accepted")
            except DLedgerError as e:
                assert e.code == RC.MEMBER_EXISTS, e
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    logs = "".join(c.nodes[x].log_text() for x in c.nodes)
    assert f"remove {victim}; voters" in logs and f"promote {victim}; voters" in logs
    c.wait_converged(timeout=20)
    with c.client(timeout=20) as cl:
        end = max(acked)
        seen: dict[bytes, int] = {}
        for i in range(0, end + 1):
            e = cl.get(i)
            if e.type == "NORMAL":
                assert bytes(e.body) not in seen, f"{bytes(e.body)!r} at {seen.get(bytes(e.body))} and {i}"
                seen[bytes(e.body)] = i
        for i, body in acked.items():
            assert seen.get(body) == i, (body, i, seen.get(body))
