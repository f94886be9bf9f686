"""Named SQL blocks (`-- name --` followed by a statement), one file per backend."""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def load_queries(filename: str) -> dict[str, str]:
    text = resources.files("store").joinpath(filename).read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        queries[name] = "\n".join(lines).strip()
    return queries


def load_migrations(backend: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) for every `NNNN_name.sql` of a backend, in order."""
    folder = resources.files("store").joinpath("migrations", backend)
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found)
