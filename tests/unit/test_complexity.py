"""No function of the packages named here is above radon's grade C (cyclomatic
complexity over 20): `radon cc -s -n D store/ policies/` prints nothing; `make lint`
runs this too. A function past it is
split where its steps are (as the policy loader's route and client parsers were)."""

from __future__ import annotations

from pathlib import Path

import pytest
from radon.complexity import cc_rank, cc_visit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("store", "policies")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_above_grade_c(package: str) -> None:
    above = [
        f"{source.relative_to(ROOT)}:{block.lineno} {block.fullname} "
        f"{cc_rank(block.complexity)} ({block.complexity})"
        for source in sorted((ROOT / package).rglob("*.py"))
        for block in cc_visit(source.read_text(encoding="utf-8"))
        if cc_rank(block.complexity) > "C"
    ]
    assert above == []
