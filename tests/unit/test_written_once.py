"""What the proxy says in one way is written in one place: the refusal that carries an
error code, and the headers that name a fenced write."""

from __future__ import annotations

import ast
from pathlib import Path

from core.records import fence_headers

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("policies", "core", "store", "reconcile", "proxy")


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (str(source.relative_to(ROOT)), ast.parse(source.read_text(encoding="utf-8")))
        for package in SHIPPED
        for source in sorted((ROOT / package).rglob("*.py"))
    ]


def test_one_class_carries_an_error_code() -> None:
    """`core.records.Refusal`, returned or raised: no second class whose constructor
    takes an `ErrorCode` (there were three, with the same fields)."""
    carriers = [
        f"{path}:{node.name}"
        for path, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for init in node.body
        if isinstance(init, ast.FunctionDef) and init.name == "__init__"
        if any(
            argument.annotation is not None and "ErrorCode" in ast.unparse(argument.annotation)
            for argument in init.args.args + init.args.kwonlyargs
        )
    ]
    assert carriers == ["core/records.py:Refusal"]


FENCE_HEADER_NAMES = {"Fence-Epoch", "Fence-Resource", "Fence-Effect-Id"}


def test_the_fence_headers_are_built_in_one_place() -> None:
    spelled = sorted(
        f"{path}:{node.lineno}"
        for path, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in FENCE_HEADER_NAMES
    )
    assert spelled and all(where.startswith("core/records.py:") for where in spelled), spelled


def test_fence_headers_leave_out_what_is_not_known() -> None:
    assert fence_headers("job:1", epoch=3, effect_id="eff_1") == {
        "Fence-Epoch": "3",
        "Fence-Resource": "job:1",
        "Fence-Effect-Id": "eff_1",
    }
    assert fence_headers("job:1", effect_id="eff_1") == {
        "Fence-Resource": "job:1",
        "Fence-Effect-Id": "eff_1",
    }
    assert fence_headers("job:1") == {"Fence-Resource": "job:1"}
