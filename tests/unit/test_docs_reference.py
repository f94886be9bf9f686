"""The generated reference pages are what devtools/docs_reference.py makes now, and what
it makes covers the code: every key the policy loader allows and every environment
variable the shipped packages read. The README stays a front page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devtools import docs_configuration, docs_reference

ROOT = Path(__file__).resolve().parents[2]
README_MOST_LINES = 300


def test_the_generated_pages_are_up_to_date() -> None:
    stale = docs_reference.stale_pages()
    assert not stale, "run `make docs`:\n" + "\n".join(stale.values())


def test_every_key_the_loader_allows_is_documented_and_no_other() -> None:
    assert set(docs_reference.policy_keys()) == set(docs_configuration.CONFIGURATION)


def test_the_key_discovery_finds_blocks_lists_and_named_entries() -> None:
    # Pins the walk itself: a plain key, a nested block, a list of blocks, a block per
    # upstream name, and a block that config/example.yaml leaves out.
    keys = docs_reference.policy_keys()
    for key in (
        "version",
        "listen.tls.client_ca",
        "routes[].reconcile.probe.path",
        "upstreams.NAME.pool.pass_through",
        "auth.clients[].cert_subject",
    ):
        assert key in keys, key


def test_every_environment_variable_read_is_documented() -> None:
    assert docs_reference.environment_variables_read() == set(docs_configuration.ENVIRONMENT)
    assert "FENCEPROXY_INSTANCE_ID" in docs_reference.environment_variables_read()


def test_an_undocumented_key_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    trimmed = dict(docs_configuration.CONFIGURATION)
    del trimmed["upstreams.NAME.connect_timeout_s"]
    monkeypatch.setattr(docs_reference, "CONFIGURATION", trimmed)
    with pytest.raises(SystemExit, match=r"undocumented \['upstreams.NAME.connect_timeout_s'\]"):
        docs_reference.configuration_page()


def test_the_defaults_are_read_from_the_parsed_policy() -> None:
    page = docs_reference.configuration_page()
    assert "| `limits.max_connections` | `1280` |" in page
    assert "| `retention.effects_days` | `30` |" in page
    assert "| `store_pool.statement_cache` | `true` |" in page


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MOST_LINES, f"README.md has {len(lines)} lines"


def test_the_readmes_outside_the_site_link_files_that_exist() -> None:
    # mkdocs --strict checks the links inside docs/; these READMEs are read on GitHub.
    readmes = [ROOT / "README.md", ROOT / "client" / "README.md"]
    readmes += sorted((ROOT / "examples").glob("*/README.md"))
    for readme in readmes:
        text = readme.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", text):
            assert (readme.parent / target).exists(), f"{readme.relative_to(ROOT)}: {target}"
