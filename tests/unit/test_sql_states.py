"""Every effect state the SQL spells is a set core/lifecycle.py exports.

The SQL cannot import BLOCKING: its partial indexes, its listings, the key's heir, GC
and retention spell the states as literals (`state IN ('DISPATCHING', ...)`, or an
`OR` chain where SQLite's planner needs one). Each such predicate here must name
exactly one of the lifecycle's sets, so that a state added to or moved between them
fails this test until every SQL file follows. A literal in any other form fails too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.lifecycle import BLOCKING, IN_FLIGHT, PROBED, SETTLED
from core.records import EffectState

STORE = Path(__file__).resolve().parents[2] / "store"
EXPORTED = {
    "BLOCKING": BLOCKING,
    "SETTLED": SETTLED,
    "IN_FLIGHT": IN_FLIGHT,
    "PROBED": PROBED,
}
# The migration that added CONFLICTING, per backend: up to it, the blocking states were
# DISPATCHING and UNKNOWN (it rebuilt the indexes on them, and its data step ran on rows
# that could not be CONFLICTING yet).
CONFLICTING_ADDED = {"sqlite": 5, "postgresql": 3}
BLOCKING_BEFORE_CONFLICTING = frozenset({"DISPATCHING", "UNKNOWN"})

_STATE = "|".join(state.value for state in EffectState)
_LITERAL = re.compile(rf"'({_STATE})'")
_COLUMN = r"[\w.]*state"
# `state IN ('A', 'B')` (or NOT IN); `state = 'A' OR state = 'B'`; `state = 'A'`;
# `state <> 'A'`; the state an INSERT INTO effects gives a new effect.
_IN_LIST = re.compile(
    rf"{_COLUMN}\s+(?:NOT\s+)?IN\s*\(\s*'(?:{_STATE})'(?:\s*,\s*'(?:{_STATE})')*\s*\)"
)
_OR_CHAIN = re.compile(
    rf"{_COLUMN}\s*=\s*'(?:{_STATE})'(?:\s+OR\s+{_COLUMN}\s*=\s*'(?:{_STATE})')*"
)
_NOT_EQUAL = re.compile(rf"{_COLUMN}\s*<>\s*'(?:{_STATE})'")
_NEW_EFFECT = re.compile(r"INSERT INTO effects\s*\([^)]*\)\s*VALUES\s*\([^)]*\)")


def sql_files() -> list[Path]:
    return sorted([*STORE.glob("*.sql"), *STORE.glob("migrations/*/*.sql")])


def without_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def state_sets(sql: str) -> list[frozenset[str]]:
    """The set of states each predicate names; raises if a literal is in none."""
    text = without_comments(sql)
    found: list[frozenset[str]] = []
    covered: list[tuple[int, int]] = []
    for pattern in (_IN_LIST, _OR_CHAIN, _NOT_EQUAL, _NEW_EFFECT):
        for match in pattern.finditer(text):
            if any(start <= match.start() < end for start, end in covered):
                continue
            covered.append(match.span())
            found.append(frozenset(_LITERAL.findall(match.group())))
    stray = [
        text[max(0, m.start() - 60) : m.end()]
        for m in _LITERAL.finditer(text)
        if not any(start <= m.start() < end for start, end in covered)
    ]
    assert stray == [], "a state literal in a form this test does not read"
    return [states for states in found if states]


def name_of(states: frozenset[str]) -> str | None:
    return next(
        (
            name
            for name, exported in EXPORTED.items()
            if states == {state.value for state in exported}
        ),
        None,
    )


def migration_of(path: Path) -> tuple[str, int] | None:
    """(backend, version) of a migration file; None for a backend's query file."""
    if path.parent.parent.name != "migrations":
        return None
    return path.parent.name, int(path.name[:4])


def written_before_conflicting(path: Path, states: frozenset[str]) -> bool:
    migration = migration_of(path)
    return (
        migration is not None
        and migration[1] <= CONFLICTING_ADDED[migration[0]]
        and states == BLOCKING_BEFORE_CONFLICTING
    )


@pytest.mark.parametrize("path", sql_files(), ids=lambda path: str(path.relative_to(STORE)))
def test_every_state_set_in_sql_is_one_the_lifecycle_exports(path: Path) -> None:
    unnamed = [
        sorted(states)
        for states in state_sets(path.read_text(encoding="utf-8"))
        if name_of(states) is None and not written_before_conflicting(path, states)
    ]
    assert unnamed == []


def test_the_current_sql_names_every_exported_set() -> None:
    """The backends' query files spell each set (and the reader above finds them): a
    reader that found nothing would pass the test above vacuously."""
    for name in ("sqlite.sql", "postgres.sql"):
        named = {name_of(states) for states in state_sets((STORE / name).read_text("utf-8"))}
        assert set(EXPORTED) <= named, name


@pytest.mark.parametrize("backend", sorted(CONFLICTING_ADDED))
def test_conflicting_came_with_the_migration_named(backend: str) -> None:
    first = next(
        path
        for path in sql_files()
        if path.parent.name == backend and "'CONFLICTING'" in path.read_text("utf-8")
    )
    assert migration_of(first) == (backend, CONFLICTING_ADDED[backend])


def test_a_literal_outside_a_predicate_fails_the_reader() -> None:
    with pytest.raises(AssertionError, match="a state literal"):
        state_sets("SELECT CASE WHEN x THEN 'UNKNOWN' END")
    assert state_sets("WHERE state IN ('UNKNOWN') OR e.state = 'DISPATCHING'") == [
        frozenset({"UNKNOWN"}),
        frozenset({"DISPATCHING"}),
    ]
