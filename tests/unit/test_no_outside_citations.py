"""Code, tests, tools and docs cite only what the repository holds.

A comment or doc page that says "see SPEC §5" or "repro t3" points a reader at a document they
do not have. Comments and docs state the rule itself or link the repository's docs
(docs/contracts.md C-numbers, docs/*.md sections). This test greps node/, ipc/, tools/, tests/,
docs/*.md and README.md for the citation forms such text used and fails on any hit outside
ALLOWED.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("node", "ipc", "tools", "tests")
# The user-facing pages: every top-level doc and the README (docs/ also holds a dashboard JSON
# and an SVG, which carry no prose).
DOC_GLOBS = ("docs/*.md", "README.md")
SUFFIXES = {".py", ".txt", ".sh", ".toml", ".md", ".cfg"}
SELF = Path(__file__).resolve()

# Each pattern is one citation form. Identifiers that merely contain the letters (SPECS,
# PEER_SPEC, SPEC_TABLE) and random seeds ("seed 0") are not citations and must not match.
PATTERNS = {
    "SPEC": re.compile(r"\bSPEC\b"),
    "spec section": re.compile(r"\b[Ss]pec §"),
    "seed document": re.compile(r"\bseeds? 00\d"),
    "issue": re.compile(r"\b[Ii]ssue \d"),
    "STYLE": re.compile(r"\bSTYLE\b"),
    "contract number": re.compile(r"\bcontract C\d"),
    "CONTRACT": re.compile(r"\bCONTRACT\b"),
    "repro": re.compile(r"\b[Rr]epro t\d"),
    "shared folder": re.compile(r"\.\./shared/"),
}

# Files exempt from the rule (each must exist: see test_every_allowed_file_exists). None today.
ALLOWED: set[str] = set()


def citations(text: str) -> list[tuple[int, str, str]]:
    """(line number, pattern name, line) for every citation in `text`."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        for name, pat in PATTERNS.items():
            if pat.search(line):
                hits.append((n, name, line.strip()))
    return hits


def _files() -> list[Path]:
    out = []
    for d in DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts and p != SELF:
                out.append(p)
    for pattern in DOC_GLOBS:
        out.extend(sorted(ROOT.glob(pattern)))
    return out


@pytest.mark.parametrize(("line", "name"), [
    ("peer, SPEC §2). They share", "SPEC"),
    ("    # SPEC §3 \"term < mine -> EXPIRED_TERM\"", "SPEC"),
    ("a lease (see spec §5)", "spec section"),
    ("handleDoCompare, seed 000 §6.4.4", "seed document"),
    ("(seeds 001, 004; ...)", "seed document"),
    ("install (issue 11 §4)", "issue"),
    ("Failover timing rules (Issue 12)", "issue"),
    ("etcd-raft style (STYLE §1)", "STYLE"),
    ("I/O is injectable (contract C7)", "contract number"),
    ("(CONTRACT \"Ports\")", "CONTRACT"),
    ("the lease (repro t5)", "repro"),
    ("\"\"\"Repro t3: a follower", "repro"),
    ("(repro ../shared/repro/t1_fastpath_crc.py)", "shared folder"),
])
def test_each_citation_form_is_found(line: str, name: str) -> None:
    assert name in {n for _, n, _ in citations(line)}


@pytest.mark.parametrize("line", [
    "from tools.sim.smcheck import SPECS",
    'PEER_SPEC = ";".join(...)',
    "assert SPEC_TABLE.keys()",
    "_first_failure('follower-commit', range(0, 5))  # seed 0 today",
    "(docs/contracts.md C1)",
    "DLedger issue #325 (a leader steps down on any higher term)",
    "Raft paper §5.3",
    "mutation t3-two-reads needs it",
    "the contracts in docs/contracts.md",
])
def test_what_is_not_a_citation_is_not_found(line: str) -> None:
    assert citations(line) == []


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = []
    for p in _files():
        rel = p.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        for n, name, line in citations(p.read_text(encoding="utf-8", errors="replace")):
            found.append(f"{rel}:{n}: [{name}] {line[:100]}")
    assert not found, ("state the rule or link the repository doc (docs/contracts.md, docs/*.md) "
                       "instead of:\n" + "\n".join(found))


def test_the_docs_and_the_readme_are_scanned() -> None:
    """A scan that silently stopped reading docs/ (a moved folder, a wrong glob) would pass on
    any citation there."""
    rels = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert "README.md" in rels
    assert {"docs/contracts.md", "docs/replication.md", "docs/performance.md"} <= rels


def test_every_allowed_file_exists() -> None:
    """An exemption for a file that was moved or deleted would silently exempt nothing; its
    entry must go."""
    missing = sorted(rel for rel in ALLOWED if not (ROOT / rel).is_file())
    assert not missing, f"remove from ALLOWED (no such file): {missing}"
