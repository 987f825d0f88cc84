"""Exactly-once appends through leader crashes (docs/client.md "Sessions", docs/contracts.md C19):
real processes, real SIGKILLs. A client resends every unanswered append under its session; the new
leader answers a resend of an entry it already holds with the original index. Afterwards every
replica holds each acknowledged body exactly once, at the index it was acknowledged with."""


from cluster import AppendWriter, assert_acked_once_everywhere, wait_for


def test_appends_survive_leader_kills_exactly_once(make_cluster):
    c = make_cluster(3)
    c.wait_leader(timeout=15)
    writers = [AppendWriter(c.client(timeout=15.0), "seq", 1, close_client=True),
               AppendWriter(c.client(timeout=15.0), "pipe", 32, close_client=True)]
    try:
        for _ in range(3):
            counts = [len(w.acked) for w in writers]
            wait_for(lambda counts=counts: all(len(w.acked) > k + 30 for w, k in zip(writers, counts, strict=True)),
                     30, "appends flowing")
            lead = c.wait_leader(timeout=15)
            c.nodes[lead].kill()
            c.wait_leader(timeout=15, among=[x for x in c.nodes if x != lead])
            c.nodes[lead].start()
        counts = [len(w.acked) for w in writers]
        wait_for(lambda: all(len(w.acked) > k + 30 for w, k in zip(writers, counts, strict=True)), 30,
                 "appends flowing after the last kill")
    finally:
        for w in writers:
            w.stop()
    c.wait_converged(timeout=30)
    for w in writers:
        assert not w.errors, f"{w.name}: {w.errors[:3]}"  # resent until acknowledged: none lost, none indeterminate
        order = [w.acked[b] for b in sorted(w.acked)]  # bodies are numbered in submission order
        assert order == sorted(order), f"{w.name}: appends acknowledged out of submission order"
    for node in c.nodes.values():
        node.stop()
    assert_acked_once_everywhere(c, writers)
