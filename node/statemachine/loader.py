"""Turn ``--state-machine NAME`` and its options into a StateMachine instance.

NAME is a built-in name (``kv``) or ``package.module:Class`` (``Class`` may be dotted, for a
nested class). The module must be importable by the node (installed, or on PYTHONPATH).

Every bad input is a ``StateMachineSpecError`` (a ``ValueError``) with a one-line message that
names the spec and the cause, so the config check and the CLI can print it as is (bad input is one
line, never a traceback: docs/contracts.md C23) and the node refuses to start instead of failing on
the first committed entry. ``resolve_state_machine`` checks a spec without constructing anything,
for config validation before any process starts.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping

from node.statemachine.api import StateMachine

BUILTINS: Mapping[str, str] = {
    "kv": "node.statemachine.kv:KVStateMachine",
}


class StateMachineSpecError(ValueError):
    """A ``--state-machine`` spec, or its options, that cannot give a state machine."""


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def resolve_state_machine(spec: str) -> type[StateMachine]:
    """The class `spec` names, imported and checked (not instantiated)."""
    target = BUILTINS.get(spec, spec)
    module_name, colon, attr_path = target.partition(":")
    module_name, attr_path = module_name.strip(), attr_path.strip()
    if not colon:
        builtins = ", ".join(sorted(BUILTINS))
        raise StateMachineSpecError(
            f"state machine {spec!r}: expected a built-in name ({builtins}) or package.module:Class")
    if not module_name or not attr_path:
        raise StateMachineSpecError(f"state machine {spec!r}: expected package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Only "not found" when the missing module is the spec's own (or a parent package);
        # a module that exists but imports something missing is an import failure.
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise StateMachineSpecError(
                f"state machine {spec!r}: module {module_name!r} not found") from e
        raise StateMachineSpecError(
            f"state machine {spec!r}: importing {module_name!r} failed: {_one_line(e)}") from e
    except Exception as e:
        raise StateMachineSpecError(
            f"state machine {spec!r}: importing {module_name!r} failed: {_one_line(e)}") from e
    obj: object = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise StateMachineSpecError(
                f"state machine {spec!r}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, type) or not issubclass(obj, StateMachine):
        raise StateMachineSpecError(
            f"state machine {spec!r}: {attr_path} is not a subclass of "
            "node.statemachine.api.StateMachine")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise StateMachineSpecError(f"state machine {spec!r}: {attr_path} does not implement {missing}")
    return obj


def load_state_machine(spec: str, options: Mapping[str, str] | None = None) -> StateMachine:
    """A new instance of the class `spec` names, constructed as ``cls(options)``."""
    cls = resolve_state_machine(spec)
    opts = dict(options or {})
    for k, v in opts.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise StateMachineSpecError(
                f"state machine {spec!r}: option {k!r} must map a str to a str, got {type(v).__name__}")
    try:
        return cls(opts)
    except Exception as e:
        raise StateMachineSpecError(f"state machine {spec!r}: constructor failed: {_one_line(e)}") from e


def parse_options(pairs: Iterable[str]) -> dict[str, str]:
    """``["key=value", ...]`` (a repeated command-line option) as a dict. The value may contain
    ``=``; the key may not be empty; a key given twice is an error rather than a silent
    override, since options are meant to be equal on every replica."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise StateMachineSpecError(f"state machine option {pair!r}: expected key=value")
        if key in out:
            raise StateMachineSpecError(f"state machine option {key!r} given twice")
        out[key] = value
    return out
