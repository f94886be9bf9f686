"""Every statement the store runs is a named query of its backend's SQL files
(store/base.py): no Python module of store/ holds SQL of its own. What the connectors
send themselves is transaction control (BEGIN, COMMIT, ROLLBACK) and SQLite's
connection settings (PRAGMA); a schema file or a migration is run whole by
store/schema.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

STORE = Path(__file__).resolve().parents[2] / "store"
STATEMENT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|WITH|TRUNCATE)\b")


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def inline_statements(source: str) -> list[str]:
    tree = ast.parse(source)
    skipped = docstrings(tree)
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skipped
        and STATEMENT.match(node.value)
    ]


def test_no_module_of_the_store_holds_a_statement_of_its_own() -> None:
    found = {
        path.name: statements
        for path in sorted(STORE.glob("*.py"))
        if (statements := inline_statements(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_a_statement_in_a_module_is_found() -> None:
    source = '"""SELECT in a docstring is prose."""\nx = "SELECT 1"\ny = f"UPDATE t SET a = {1}"\n'
    assert inline_statements(source) == ["SELECT 1", "UPDATE t SET a = "]
