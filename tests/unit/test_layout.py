"""The package floors of the docs' "Layout" (docs/contributing/index.md): each package
imports only itself and the packages below it, so there is no cycle between them
(policies must never import the store, for instance, which is why the store URL schemes
live in policies/)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORS = ("policies", "core", "store", "reconcile", "proxy")
BESIDE = ("demo", "support", "bench", "examples", "tests")


def project_imports(source: Path) -> set[str]:
    """The project's top-level packages that `source` imports (TYPE_CHECKING included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.partition(".")[0])
    return found & {*FLOORS, *BESIDE}


@pytest.mark.parametrize("floor", range(len(FLOORS)), ids=FLOORS)
def test_a_package_imports_only_the_floors_below_it(floor: int) -> None:
    allowed = set(FLOORS[: floor + 1])
    sources = sorted((ROOT / FLOORS[floor]).rglob("*.py"))
    assert sources
    upward = {
        str(source.relative_to(ROOT)): sorted(project_imports(source) - allowed)
        for source in sources
        if project_imports(source) - allowed
    }
    assert upward == {}


# The store's reconciliation calls: the sweep, what is in doubt, an operator's decision,
# a probe's record, the probe schedule.
STORE_RECONCILING = frozenset(
    {"recover", "in_doubt", "resolve", "record_probe", "claim_due_probes"}
)


def _reaches_the_store(node: ast.expr) -> bool:
    """`store.x` or `something.store.x`: how proxy/ names its Store."""
    return (isinstance(node, ast.Name) and node.id == "store") or (
        isinstance(node, ast.Attribute) and node.attr == "store"
    )


def test_the_proxy_reconciles_only_through_reconcile() -> None:
    """reconcile/ owns reconciliation: proxy/ parses what an operator or a client sent
    and calls reconcile/, never the store's reconciliation calls itself, so the admin
    API and the CLI cannot reconcile in two ways."""
    sources = sorted((ROOT / "proxy").rglob("*.py"))
    direct = {
        f"{source.relative_to(ROOT)}:{node.lineno}": node.attr
        for source in sources
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr in STORE_RECONCILING
        and _reaches_the_store(node.value)
    }
    assert direct == {}


def test_the_examples_use_only_the_client_library() -> None:
    """examples/ shows a worker's view: it runs beside any proxy, through
    fenceproxy_client and HTTP, never by importing the server's own packages."""
    sources = sorted((ROOT / "examples").rglob("*.py"))
    assert sources
    server_side = {
        str(source.relative_to(ROOT)): sorted(project_imports(source) - {"examples"})
        for source in sources
        if project_imports(source) - {"examples"}
    }
    assert server_side == {}


def test_mypy_checks_every_top_level_python_directory() -> None:
    """`mypy` (strict) runs on the directories pyproject.toml lists; a new top-level
    directory of Python code (examples/, client/, ...) must be listed, or it goes
    unchecked while `make lint` still passes. ruff checks the whole tree by default."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    checked = set(config["tool"]["mypy"]["files"])
    with_python = {
        path.name
        for path in ROOT.iterdir()
        if path.is_dir() and not path.name.startswith(".") and any(path.rglob("*.py"))
    }
    assert with_python - checked == set()
    assert "exclude" not in config["tool"]["ruff"]
