"""The schema files (store/schema/postgresql.sql, sqlite.sql) are the schema: a store
migrated from the first migration ends exactly where a store created from the file
starts. Compared in the catalog, object by object (PostgreSQL: tables, columns with
their types, defaults and nullability, constraints, indexes, sequences, triggers, views
and functions by pg_get_functiondef; SQLite: sqlite_master, its SQL normalised to tokens,
and every index's columns), and the rows a store starts with (store_identity's random id
and time aside). A failure names each object that differs, with both definitions."""

from __future__ import annotations

import contextlib
import difflib
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import asyncpg

from store import open_store
from store.queries import load_migrations
from store.schema import schema_file
from tests import pg

Catalog = dict[str, str]

# A new store's own: random, or the moment it was created.
VOLATILE = {"store_identity": ("store_id", "created_at"), "schema_migrations": ("applied_at",)}

PG_CATALOG = {
    "column": """
        SELECT c.relname || '.' || a.attname,
               format('#%s %s not_null=%s default=%s identity=%s generated=%s', a.attnum,
                      format_type(a.atttypid, a.atttypmod), a.attnotnull,
                      pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v')
          AND a.attnum > 0 AND NOT a.attisdropped""",
    "table": """
        SELECT c.relname, format('kind=%s persistence=%s', c.relkind, c.relpersistence)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')""",
    "constraint": """
        SELECT c.conrelid::regclass::text || '.' || c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = 'public'""",
    "index": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "sequence": """
        SELECT s.sequencename,
               format('%s start=%s min=%s max=%s by=%s cycle=%s cache=%s owned by %s',
                      s.data_type, s.start_value, s.min_value, s.max_value, s.increment_by,
                      s.cycle, s.cache_size,
                      (SELECT d.refobjid::regclass::text || '.' || a.attname
                       FROM pg_depend d JOIN pg_attribute a
                         ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                       WHERE d.objid = (quote_ident(s.schemaname) || '.'
                                        || quote_ident(s.sequencename))::regclass
                         AND d.deptype IN ('a', 'i')))
        FROM pg_sequences s WHERE s.schemaname = 'public'""",
    "trigger": """
        SELECT t.tgrelid::regclass::text || '.' || t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND NOT t.tgisinternal""",
    "view": """
        SELECT viewname, definition FROM pg_views WHERE schemaname = 'public'""",
    "function": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public'""",
}


def differences(migrated: Mapping[str, str], created: Mapping[str, str]) -> str:
    """Each object that differs, named, with a diff of its two definitions."""
    lines = []
    for name in sorted(set(migrated) | set(created)):
        if name not in created:
            lines.append(f"{name}: only after the migrations:\n    {migrated[name]}")
        elif name not in migrated:
            lines.append(f"{name}: only in the schema file:\n    {created[name]}")
        elif migrated[name] != created[name]:
            diff = difflib.unified_diff(
                migrated[name].splitlines(),
                created[name].splitlines(),
                "after the migrations",
                "from the schema file",
                lineterm="",
            )
            lines.append(f"{name} differs:\n" + "\n".join(f"    {line}" for line in diff))
    return "\n".join(lines)


def assert_same(migrated: Catalog, created: Catalog) -> None:
    found = differences(migrated, created)
    assert not found, (
        "migrating from the first migration does not reach the schema file; edit the "
        f"schema file or the migration:\n{found}"
    )


# -- PostgreSQL --------------------------------------------------------------------


async def pg_catalog(url: str) -> Catalog:
    conn = await asyncpg.connect(url)
    try:
        found: Catalog = {}
        for kind, query in PG_CATALOG.items():
            for name, definition in await conn.fetch(query):
                found[f"{kind} {name}"] = str(definition)
        for (table,) in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ):
            rows = await conn.fetch(f'SELECT * FROM "{table}"')
            found[f"rows of {table}"] = rows_text(table, [dict(row) for row in rows])
        return found
    finally:
        await conn.close()


def rows_text(table: str, rows: list[dict[str, object]]) -> str:
    hidden = VOLATILE.get(table, ())
    shown = [{k: v for k, v in row.items() if k not in hidden} for row in rows]
    return "\n".join(sorted(repr(sorted(row.items())) for row in shown))


async def pg_after_first_migration(url: str) -> None:
    """What the first release left: migration 0001 alone, and its record."""
    [(version, name, sql), *_] = load_migrations("postgresql")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        await conn.execute(sql)
        await conn.execute("INSERT INTO schema_migrations VALUES ($1, $2)", version, name)
    finally:
        await conn.close()


async def opened(url: str) -> None:
    store = open_store(url, lambda: 1000.0, "schema-test")
    await store.open()
    await store.close()


async def test_postgresql_migrated_from_the_first_migration_is_the_schema_file() -> None:
    admin = pg.require_admin_url()
    migrated_url = await pg.create_database_async(admin)
    created_url = await pg.create_database_async(admin)
    try:
        await pg_after_first_migration(migrated_url)
        await opened(migrated_url)
        await opened(created_url)
        migrated, created = await pg_catalog(migrated_url), await pg_catalog(created_url)
    finally:
        await pg.drop_database_async(migrated_url, admin)
        await pg.drop_database_async(created_url, admin)
    assert "function fenceproxy_receipt(text,text,text,text,text,integer,text,boolean," in (
        " ".join(created)
    )
    assert_same(migrated, created)


# -- SQLite ------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\]|\w+|[^\s\w]""",
    re.DOTALL,
)


def sql_tokens(sql: str | None) -> str:
    """SQL as SQLite keeps it, without what does not change its meaning: comments,
    whitespace, the case of words, and the quotes around identifiers (a table renamed
    into place is kept as CREATE TABLE "name")."""
    if sql is None:
        return "(none)"
    tokens = []
    for token in _TOKEN.findall(sql):
        if token.startswith(("--", "/*")):
            continue
        if token[0] in '"`[':
            token = token[1:-1]
        tokens.append(token if token.startswith("'") else token.lower())
    return " ".join(tokens)


def sqlite_catalog(path: Path) -> Catalog:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.row_factory = sqlite3.Row
        found: Catalog = {}
        for entry in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
            definition = f"on {entry['tbl_name']}: {sql_tokens(entry['sql'])}"
            if entry["type"] == "index":
                columns = conn.execute(f'PRAGMA index_xinfo("{entry["name"]}")').fetchall()
                definition += "\n" + repr([tuple(column) for column in columns])
            found[f"{entry['type']} {entry['name']}"] = definition
        tables = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name <> 'sqlite_sequence'"
        ).fetchall()
        for (table,) in tables:
            rows = [dict(row) for row in conn.execute(f'SELECT * FROM "{table}"')]
            found[f"rows of {table}"] = rows_text(table, rows)
        return found


def sqlite_after_first_migration(path: Path) -> None:
    [(version, name, sql), *_] = load_migrations("sqlite")
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        conn.executescript(sql)
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 1000.0)", (version, name))


async def test_sqlite_migrated_from_the_first_migration_is_the_schema_file(
    tmp_path: Path,
) -> None:
    migrated_path, created_path = tmp_path / "migrated.db", tmp_path / "created.db"
    sqlite_after_first_migration(migrated_path)
    await opened(f"sqlite:///{migrated_path}")
    await opened(f"sqlite:///{created_path}")
    assert_same(sqlite_catalog(migrated_path), sqlite_catalog(created_path))


# -- both --------------------------------------------------------------------------


def test_the_comparison_names_what_differs() -> None:
    found = differences(
        {"function f(text)": "BEGIN\n  a;\nEND", "index i": "on t (a)"},
        {"function f(text)": "BEGIN\n  b;\nEND", "table t": "kind=r"},
    )
    assert "function f(text) differs" in found
    assert "-  a;" in found and "+  b;" in found
    assert "index i: only after the migrations" in found
    assert "table t: only in the schema file" in found


def test_sqlite_sql_is_compared_by_its_tokens() -> None:
    assert sql_tokens("CREATE TABLE \"t\" (\n  a INTEGER, -- why\n  b TEXT DEFAULT 'X')") == (
        sql_tokens("create table t (a integer, b text default 'X')")
    )
    assert sql_tokens("CREATE TABLE t (a INTEGER)") != sql_tokens("CREATE TABLE t (a REAL)")
    lower, upper = "CREATE TABLE t (a DEFAULT 'x')", "CREATE TABLE t (a DEFAULT 'X')"
    assert sql_tokens(lower) != sql_tokens(upper)


def test_each_backend_has_a_schema_file() -> None:
    for backend in ("postgresql", "sqlite"):
        assert "CREATE TABLE store_meta" in schema_file(backend)
