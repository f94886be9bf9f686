"""Which releases may share a store (core/releases.py), and the records of the releases:
every shipped migration's declaration, the version, releases.toml and CHANGELOG.md."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from core.releases import (
    OLDEST_PEER,
    Contraction,
    Peer,
    contraction_refusal,
    declared_oldest_release,
    older,
    parse_version,
    schema_floor,
    start_refusal,
)
from store.queries import load_migrations

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_versions_compare_as_numbers_and_unknown_ones_never_compare() -> None:
    assert parse_version("0.10.0") == (0, 10, 0)
    assert older("0.9.0", "0.10.0")
    assert not older("0.10.0", "0.9.0")
    assert not older("0.2.0", "0.2.0")
    assert parse_version("unknown") is None
    assert not older("unknown", "0.2.0")
    assert not older("0.2.0", None)


def test_a_migration_declares_its_oldest_release_in_its_first_comment_lines() -> None:
    assert declared_oldest_release("-- drops x\n-- oldest release: 0.3.0\nDROP x;") == "0.3.0"
    assert declared_oldest_release("-- adds y\nALTER TABLE t ADD y;") is None
    # Below the first statement, it is a comment about something else.
    assert declared_oldest_release("SELECT 1;\n-- oldest release: 0.3.0\n") is None
    with pytest.raises(ValueError, match="'-- oldest release: soon' is not a version"):
        declared_oldest_release("-- oldest release: soon\nDROP x;")


def test_the_schema_floor_is_the_highest_declared_release() -> None:
    low, high = Contraction(30, "a", "0.9.0"), Contraction(25, "b", "0.10.0")
    assert schema_floor([low, high]) == high
    assert schema_floor([]) is None


def test_a_release_below_the_schema_floor_refuses_naming_the_migration() -> None:
    refusal = start_refusal("0.2.0", "0.1.0", [Contraction(25, "drop_x", "0.3.0")], [])
    assert refusal is not None
    assert "needs fenceproxy 0.3.0 or later (migration 0025 drop_x); this is 0.2.0" in refusal
    assert start_refusal("0.3.0", "0.2.0", [Contraction(25, "drop_x", "0.3.0")], []) is None


def test_a_release_refuses_a_running_peer_older_than_it_serves_beside() -> None:
    peers = [Peer("replica-a", "0.2.0", "0.1.0"), Peer("replica-b", "0.1.0", None)]
    refusal = start_refusal("0.3.0", "0.2.0", [], peers)
    assert refusal is not None
    assert "replica replica-b runs fenceproxy 0.1.0" in refusal
    assert "0.3.0 serves beside 0.2.0 or later only" in refusal
    # The window the replicas' beats are judged by, as the operator is told it.
    assert "counts as running for 30 s after its last beat" in refusal
    assert start_refusal("0.3.0", "0.1.0", [], peers) is None


def test_a_release_refuses_a_running_peer_that_cannot_serve_beside_it() -> None:
    refusal = start_refusal("0.2.0", "0.1.0", [], [Peer("replica-n", "0.4.0", "0.3.0")])
    assert refusal is not None
    assert "replica replica-n runs fenceproxy 0.4.0, which serves beside 0.3.0" in refusal
    assert start_refusal("0.3.0", "0.1.0", [], [Peer("replica-n", "0.4.0", "0.3.0")]) is None


def test_a_contraction_waits_for_every_older_replica() -> None:
    peers = [Peer("b", "0.2.0", "0.1.0"), Peer("a", "0.1.0", None), Peer("c", "0.3.0", "0.2.0")]
    refusal = contraction_refusal(25, "drop_x", "0.3.0", peers)
    assert refusal is not None
    assert "migration 0025 drop_x removes what releases before 0.3.0 use" in refusal
    assert "a (0.1.0), b (0.2.0);" in refusal
    assert contraction_refusal(25, "drop_x", "0.2.0", [Peer("c", "0.3.0", None)]) is None


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_every_shipped_migration_leaves_this_release_and_its_oldest_peer_working(
    backend: str,
) -> None:
    """A release cannot ship a contraction it cannot run on itself, nor one that breaks
    the oldest release it says it serves beside."""
    for version, name, sql in load_migrations(backend):
        declared = declared_oldest_release(sql)
        assert not older(VERSION, declared), f"{backend} {version:04d} {name}: {declared}"
        assert not older(OLDEST_PEER, declared), f"{backend} {version:04d} {name}: {declared}"
    assert parse_version(OLDEST_PEER) is not None, (
        "an OLDEST_PEER that is no version enforces nothing"
    )
    assert not older(VERSION, OLDEST_PEER)


def test_every_release_is_recorded_with_its_commit_and_changelog_entry() -> None:
    releases = tomllib.loads((ROOT / "releases.toml").read_text(encoding="utf-8"))["release"]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = dict(
        (match.group(1), match.group(2))
        for match in re.finditer(r"^## (\S+)[^\n]*\n(.*?)(?=^## |\Z)", changelog, re.M | re.S)
    )
    assert VERSION in sections, f"CHANGELOG.md has no entry for {VERSION}"
    for release in releases:
        assert re.fullmatch(r"[0-9a-f]{40}", release["commit"]), release
        assert release["tag"] == f"v{release['version']}", release
        entry = sections.get(release["version"])
        assert entry is not None, f"CHANGELOG.md has no entry for {release['version']}"
        assert f"Tag `{release['tag']}`, commit `{release['commit']}`" in entry
    for version, entry in sections.items():
        for part in ("**Contract**", "**Schema**", "**Serves beside**", "**Rollback**"):
            if version == releases[0]["version"] and part == "**Rollback**":
                continue  # the first release has nothing to roll back to
            assert part in entry, f"CHANGELOG.md {version}: no {part}"
