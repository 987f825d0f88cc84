"""`dledger chaos --kv`: clients of the replicated KV store doing put/get/cas/delete on a few
keys while faults happen, each operation recorded for the linearizability check
(tools/chaos/linearizability.py).

Every written value is unique (client, sequence number), so a read names the write it saw.
A KVClient call that raises an *indeterminate* error (a timeout, a lost connection, a result
no longer known) is recorded with no completion time: it may have taken effect at any moment
after its invocation, or never. A *definite* error means the operation did not happen (not in
the log): it is left out of the history.
"""

from __future__ import annotations

import random

from ipc.client import DLedgerError, KVClient, KVError
from tools.chaos.linearizability import CAS, DELETE, GET, PUT, Operation
from tools.chaos.workload import AckedLoad, Clock


class KVWorker(AckedLoad):
    """One KV client: a seeded random mix of operations on `keys`, one at a time."""

    def __init__(self, name: str, peers: str, group: str, clock: Clock, *, seed: int, keys: int,
                 timeout: float) -> None:
        super().__init__(f"chaos-{name}")
        self.client_name, self.clock = name, clock
        self.kv = KVClient(peers, group, timeout=timeout)
        self.rng = random.Random(seed)
        self.keys = [b"key%d" % i for i in range(keys)]
        self.ops: list[Operation] = []
        self.seq = 0
        self.last_seen: dict[bytes, bytes | None] = {}  # what this client last read per key (for cas)

    def _value(self) -> bytes:
        self.seq += 1
        return b"%s:%d" % (self.client_name.encode(), self.seq)

    def run(self) -> None:
        while not self._stop_evt.is_set():
            self.one()

    def one(self) -> None:
        key = self.rng.choice(self.keys)
        r = self.rng.random()
        t0 = self.clock.now()
        try:
            if r < 0.35:
                got = self.kv.get(key)
                value = None if got is None else got.value
                self.last_seen[key] = value
                self._done(Operation(self.client_name, GET, key, t0, self.clock.now(), output=value,
                                     revision=None if got is None else got.revision))
            elif r < 0.7:
                value = self._value()
                rev = self.kv.put(key, value)
                self.last_seen[key] = value
                self._done(Operation(self.client_name, PUT, key, t0, self.clock.now(), value=value,
                                     revision=rev), write=True)
            elif r < 0.9:
                expected, value = self.last_seen.get(key), self._value()
                swapped = self.kv.cas(key, expected, value)
                if swapped:
                    self.last_seen[key] = value
                self._done(Operation(self.client_name, CAS, key, t0, self.clock.now(), value=value,
                                     expected=expected, output=swapped), write=True)
            else:
                existed = self.kv.delete(key)
                self.last_seen[key] = None
                self._done(Operation(self.client_name, DELETE, key, t0, self.clock.now(), output=existed),
                           write=True)
        except KVError as e:
            if e.status is None:  # committed, but its outcome is no longer known
                self._unknown(key, r, t0)
            # else the store refused it (an error result): no state change, nothing to record
        except DLedgerError as e:
            if e.indeterminate:
                self._unknown(key, r, t0)
            # a definite failure: the operation did not happen, nothing to record

    def _unknown(self, key: bytes, r: float, t0: float) -> None:
        """The client cannot know whether the write took effect: no completion time. (The
        values a failed put/cas would have written were drawn already: rebuild them.)"""
        if r < 0.35:
            return  # a get that did not answer changes nothing
        if r < 0.7:
            op = Operation(self.client_name, PUT, key, t0, None, value=b"%s:%d" % (self.client_name.encode(), self.seq))
        elif r < 0.9:
            op = Operation(self.client_name, CAS, key, t0, None, value=b"%s:%d" % (self.client_name.encode(), self.seq),
                           expected=self.last_seen.get(key))
        else:
            op = Operation(self.client_name, DELETE, key, t0, None)
        self.last_seen.pop(key, None)  # unknown now: a later cas compares against absent
        with self.lock:
            self.ops.append(op)

    def _done(self, op: Operation, write: bool = False) -> None:
        with self.lock:
            self.ops.append(op)
            if write:
                self.ack_times.append(op.t_done)

    def close(self) -> None:
        self._stop_evt.set()
        self.join(timeout=120)
        self.kv.close()
