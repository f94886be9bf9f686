"""The lists of docs/reference/wire.md ("What crosses the proxy") are the ones
tests/wire/contract.py tests."""

from __future__ import annotations

import re
from pathlib import Path

from tests.wire import contract

WIRE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "wire.md"
SECTION = "What crosses the proxy"
# A bullet's header name: the first `code span` of the line.
BULLET = re.compile(r"^[-*] `([^`]+)`")


def documented_lists() -> dict[str, set[str]]:
    """The header names under each sub-heading of the section, by sub-heading."""
    lists: dict[str, set[str]] = {}
    inside = False
    current: str | None = None
    for line in WIRE_PAGE.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^(#+) (.*)$", line)
        if heading:
            level, title = len(heading.group(1)), heading.group(2).strip()
            if title == SECTION:
                inside = True
                section_level = level
                continue
            if inside and level <= section_level:
                break
            if inside:
                current = title
                lists[current] = set()
            continue
        bullet = BULLET.match(line)
        if inside and current is not None and bullet:
            lists[current].add(bullet.group(1))
    return lists


def test_the_docs_list_the_headers_the_contract_tests() -> None:
    lists = documented_lists()
    assert lists == {
        "Added": set(contract.ADDED),
        "Removed": set(contract.REMOVED),
        "Never forwarded": set(contract.NEVER_FORWARDED),
    }
