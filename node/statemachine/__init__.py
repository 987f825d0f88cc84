"""State machines applied to the committed log (docs/statemachine.md).

``api`` is what a user class implements, ``loader`` turns ``--state-machine NAME`` into an
instance, ``kv`` is the built-in replicated KV store. All three are pure (no processes, no
sockets); the applier role that drives them, and snapshot files on disk, live elsewhere.
"""

from node.statemachine.api import CommittedEntry, Result, StateMachine, StateMachineError
from node.statemachine.loader import (
    StateMachineSpecError,
    load_state_machine,
    parse_options,
    resolve_state_machine,
)

__all__ = [
    "CommittedEntry",
    "Result",
    "StateMachine",
    "StateMachineError",
    "StateMachineSpecError",
    "load_state_machine",
    "parse_options",
    "resolve_state_machine",
]
