"""The state-machine API and its loader (node/statemachine/api.py, loader.py; docs/statemachine.md
"The API"): every bad ``--state-machine`` spec is one clear line, and the documented example
works."""

from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path

import pytest

from node.statemachine import (
    CommittedEntry,
    StateMachine,
    StateMachineError,
    StateMachineSpecError,
    load_state_machine,
    parse_options,
    resolve_state_machine,
)
from node.statemachine.api import check_results
from node.statemachine.kv import KVStateMachine

DOC = Path(__file__).resolve().parents[2] / "docs" / "statemachine.md"


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """Write modules into a fresh directory on sys.path (unique names: imports are cached)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


def _spec_error(spec: str, options=None) -> str:
    with pytest.raises(StateMachineSpecError) as ei:
        load_state_machine(spec, options)
    msg = str(ei.value)
    assert "\n" not in msg, "errors are one line"
    assert msg.startswith(f"state machine {spec!r}:")
    return msg


def test_the_builtin_kv_is_loaded_by_name():
    sm = load_state_machine("kv")
    assert type(sm) is KVStateMachine
    assert resolve_state_machine("kv") is KVStateMachine
    assert resolve_state_machine("node.statemachine.kv:KVStateMachine") is KVStateMachine


@pytest.mark.parametrize("spec, cause", [
    ("counter", "expected a built-in name (kv) or package.module:Class"),
    ("", "expected a built-in name"),
    (":Counter", "expected package.module:Class"),
    ("some.module:", "expected package.module:Class"),
    ("no_such_module_xq:Counter", "module 'no_such_module_xq' not found"),
    ("node.no_such_module_xq:Counter", "module 'node.no_such_module_xq' not found"),
    ("node.statemachine.kv:NoSuchClass", "module 'node.statemachine.kv' has no attribute 'NoSuchClass'"),
    ("collections:OrderedDict", "OrderedDict is not a subclass of node.statemachine.api.StateMachine"),
    ("os:sep", "sep is not a subclass"),
    ("node.statemachine.api:StateMachine", "StateMachine does not implement apply, restore, snapshot"),
])
def test_bad_specs_are_one_clear_line(spec, cause):
    assert cause in _spec_error(spec)


def test_a_module_that_fails_to_import_is_not_reported_as_missing(user_modules):
    user_modules("sm_imports_missing", "import no_such_dependency_xq\n")
    user_modules("sm_raises", "raise RuntimeError('boom\\nsecond line')\n")
    user_modules("sm_syntax", "def broken(:\n")
    msg = _spec_error("sm_imports_missing:C")
    assert "importing 'sm_imports_missing' failed: ModuleNotFoundError" in msg
    assert "no_such_dependency_xq" in msg
    assert "importing 'sm_raises' failed: RuntimeError: boom second line" in _spec_error("sm_raises:C")
    assert "importing 'sm_syntax' failed: SyntaxError" in _spec_error("sm_syntax:C")


def test_a_half_written_class_is_refused_before_it_runs(user_modules):
    user_modules("sm_half", """
        from node.statemachine.api import StateMachine
        class Half(StateMachine):
            def apply(self, entries):
                return [None for _ in entries]
        class Outer:
            class Inner(Half):
                def snapshot(self, writer): pass
                def restore(self, reader): pass
    """)
    assert "Half does not implement restore, snapshot" in _spec_error("sm_half:Half")
    assert type(load_state_machine("sm_half:Outer.Inner")).__name__ == "Inner"  # nested classes


def test_a_failing_constructor_names_the_spec_and_the_cause(user_modules):
    user_modules("sm_picky", """
        from node.statemachine.api import StateMachine
        class Picky(StateMachine):
            def __init__(self, options):
                super().__init__(options)
                raise ValueError(f"unknown option {sorted(options)}")
            def apply(self, entries): return []
            def snapshot(self, writer): pass
            def restore(self, reader): pass
    """)
    msg = _spec_error("sm_picky:Picky", {"x": "1"})
    assert msg == "state machine 'sm_picky:Picky': constructor failed: ValueError: unknown option ['x']"
    assert "constructor failed: ValueError: the kv state machine takes no options, got x" in _spec_error("kv", {"x": "1"})
    assert "option 'n' must map a str to a str, got int" in _spec_error("kv", {"n": 1})


def test_options_reach_the_constructor_as_a_str_mapping(user_modules):
    user_modules("sm_opts", """
        from node.statemachine.api import StateMachine
        class Opts(StateMachine):
            def apply(self, entries): return []
            def snapshot(self, writer): pass
            def restore(self, reader): pass
    """)
    sm = load_state_machine("sm_opts:Opts", parse_options(["a=1", "url=x=y", "empty="]))
    assert dict(sm.options) == {"a": "1", "url": "x=y", "empty": ""}
    assert dict(load_state_machine("sm_opts:Opts").options) == {}


@pytest.mark.parametrize("pairs, cause", [
    (["novalue"], "expected key=value"),
    (["=1"], "expected key=value"),
    (["a=1", "a=2"], "option 'a' given twice"),
])
def test_bad_option_pairs(pairs, cause):
    with pytest.raises(StateMachineSpecError, match=re.escape(cause)):
        parse_options(pairs)


def _entries(*bodies: bytes, first: int = 1) -> list[CommittedEntry]:
    return [CommittedEntry(first + i, 1, b) for i, b in enumerate(bodies)]


def test_check_results_wants_one_bytes_or_none_per_entry():
    es = _entries(b"a", b"b")
    assert check_results(es, [b"x", None]) == [b"x", None]
    out = check_results(es, [bytearray(b"y"), memoryview(b"z")])
    assert out == [b"y", b"z"] and all(type(r) is bytes for r in out)
    with pytest.raises(StateMachineError, match="1 results for 2 entries"):
        check_results(es, [b"x"])
    with pytest.raises(StateMachineError, match="not a list"):
        check_results(es, (b"x", b"y"))
    with pytest.raises(StateMachineError, match="index 2 is str"):
        check_results(es, [b"x", "y"])


def test_query_is_optional_and_refused_by_default(user_modules):
    user_modules("sm_noquery", """
        from node.statemachine.api import StateMachine
        class NoQuery(StateMachine):
            def apply(self, entries): return []
            def snapshot(self, writer): pass
            def restore(self, reader): pass
    """)
    sm = load_state_machine("sm_noquery:NoQuery")
    with pytest.raises(NotImplementedError, match="NoQuery serves no queries"):
        sm.query(b"q")
    sm.close()  # the default close is a no-op


def _doc_example() -> str:
    text = DOC.read_text()
    section = text[text.index("## Example"):]
    return section[section.index("```python\n") + 10:section.index("```\n", section.index("```python"))]


def test_the_documented_counter_example_works(user_modules):
    user_modules("sm_doc_counter", _doc_example())
    sm = load_state_machine("sm_doc_counter:Counter", {"start": "10"})
    assert isinstance(sm, StateMachine)
    assert sm.apply(_entries(b"5", b"oops", memoryview(b"-3"))) == [b"15", b"error: not an integer", b"12"]
    buf = io.BytesIO()
    sm.snapshot(buf)
    fresh = load_state_machine("sm_doc_counter:Counter")
    fresh.restore(io.BytesIO(buf.getvalue()))
    assert fresh.apply(_entries(b"1", first=4)) == sm.apply(_entries(b"1", first=4)) == [b"13"]
    with pytest.raises(ValueError):
        fresh.restore(io.BytesIO(b"1x"))
    assert fresh.apply(_entries(b"0", first=5)) == [b"13"]  # the failed restore changed nothing
    assert "constructor failed: ValueError" in _spec_error("sm_doc_counter:Counter", {"start": "x"})
