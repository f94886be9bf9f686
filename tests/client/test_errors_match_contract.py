"""The client's error classes are the proxy's code table, one class per code, named after
it in CamelCase; and the client imports nothing of the proxy (it is installed alone)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import fenceproxy_client
from fenceproxy_client import errors

from core.codes import ErrorCode
from tests.unit.test_layout import project_imports

CLIENT_SOURCES = Path(fenceproxy_client.__file__).resolve().parent


def camel_case(code: str) -> str:
    return "".join(word.capitalize() for word in code.split("_"))


def test_every_code_of_the_contract_has_its_class_and_no_other() -> None:
    expected = {camel_case(code.value): code.value for code in ErrorCode}
    found = {cls.__name__: cls.code for cls in errors.FenceError.__subclasses__()}
    missing = sorted(set(expected) - set(found))
    assert not missing, f"add to client/fenceproxy_client/errors.py: {missing}"
    assert found == expected
    assert {code: cls.__name__ for code, cls in errors.BY_CODE.items()} == {
        code: name for name, code in expected.items()
    }


def test_each_class_is_reachable_by_its_name() -> None:
    for code in ErrorCode:
        assert getattr(errors, camel_case(code.value)).code == code.value


def imported_modules(source: Path) -> set[str]:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.partition(".")[0])
    return found


def test_the_client_imports_only_the_standard_library_and_httpx() -> None:
    """Nothing of the proxy (the client is installed without it), no other dependency."""
    sources = sorted(CLIENT_SOURCES.rglob("*.py"))
    assert sources
    allowed = {*sys.stdlib_module_names, "httpx", "fenceproxy_client"}
    for source in sources:
        assert imported_modules(source) <= allowed, source
        assert project_imports(source) == set(), source
