"""Pure Raft decisions, so tests and the simulator can drive them deterministically: no sockets,
files, clocks or randomness inside.

Plain functions over plain data, so every DLedger decision table is testable in microseconds;
the role processes in ``node/roles`` only execute the effects. Election: ``election`` (the
ElectorCore state machine), ``vote`` (handleVote, candidate tally/parse), ``heartbeat``
(handleHeartBeat, leader tally/parse), ``election_types`` (config and views).
See docs/election.md.
"""
