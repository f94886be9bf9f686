"""The mutation runner: which mutants it makes, and what a run reports."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from devtools.mutants import Mutant, generate_mutants
from devtools.mutate import DEFAULT_MODULES, ROOT, Result, main, report, run_mutants


def descriptions(source: str) -> list[str]:
    return [mutant.description for mutant in generate_mutants("m.py", source)]


def test_a_comparison_gets_its_boundary_and_its_negation() -> None:
    assert descriptions("def f(a, b):\n    return a < b\n") == [
        "return value 'a < b' -> None",
        "'<' -> '<=' in 'a < b'",
        "'<' -> '>=' in 'a < b'",
    ]


def test_operators_constants_and_calls_are_mutated() -> None:
    source = "def f(a, b):\n    check(a)\n    return min(a + 1, b * 0.5) if a and not b else 'x'\n"
    assert descriptions(source) == [
        "call to check() removed",
        "return value \"min(a + 1, b * 0.5) if a and not b else 'x'\" -> None",
        "'and' -> 'or' in 'a and not b'",
        "'not' removed in 'not b'",
        "min() -> max() in 'min(a + 1, b * 0.5)'",
        "'+' -> '-' in 'a + 1'",
        "1 -> 2",
        "1 -> 0",
        "'*' -> '/' in 'b * 0.5'",
        "0.5 -> 1.0",
        "0.5 -> 1.5",
        "'x' -> ''",
    ]


def test_an_awaited_call_is_removed_and_named_with_its_arguments() -> None:
    source = "async def f(tx):\n    await tx.execute('raise_epoch_floor', floor=1)\n"
    assert descriptions(source) == [
        "awaited call \"tx.execute('raise_epoch_floor', floor=1)\" removed",
        "'raise_epoch_floor' -> ''",
        "1 -> 2",
        "1 -> 0",
    ]


def test_match_keeps_only_the_mutants_it_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list", "--match", "raise_epoch_floor", "store/housekeeping.py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "awaited call 'tx.execute(\"raise_epoch_floor\", floor=max(int(r...' removed",
        "'raise_epoch_floor' -> ''",
    ]


def test_docstrings_annotations_asserts_and_decorators_are_left_alone() -> None:
    source = (
        '"""Module docstring."""\n'
        "@dataclass(frozen=True)\n"
        "class C:\n"
        '    """Class docstring."""\n'
        "    size: Literal[3]\n"
        "def f(x: Literal[1]) -> Literal[2]:\n"
        "    assert x is not None\n"
        "    return x\n"
    )
    assert descriptions(source) == ["return value 'x' -> None"]


def test_mutants_of_a_real_module_are_distinct_valid_and_reproducible() -> None:
    source = (ROOT / "policies" / "templates.py").read_text(encoding="utf-8")
    mutants = generate_mutants("policies/templates.py", source)
    texts = [mutant.source for mutant in mutants]
    assert len(set(texts)) == len(texts)
    assert ast.unparse(ast.parse(source)) not in texts
    for text in texts:
        compile(text, "policies/templates.py", "exec")
    assert generate_mutants("policies/templates.py", source) == mutants


def test_list_prints_each_mutant_as_file_line_description(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--list", "core/outcomes.py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines
    assert all(line.startswith("core/outcomes.py:") for line in lines)
    # The line as the file has it now: the listing names the mutated line.
    source = Path("core/outcomes.py").read_text(encoding="utf-8").splitlines()
    line = source.index("    if isinstance(result, Answered):") + 1
    assert f"core/outcomes.py:{line}: condition 'isinstance(result, Answered)' negated" in lines


def test_the_report_scores_each_module_and_lists_the_survivors() -> None:
    results = [
        Result(Mutant("a.py", 1, "'+' -> '-' in 'a + b'", ""), "killed"),
        Result(Mutant("a.py", 2, "'<' -> '<=' in 'n < 10'", ""), "survived"),
        Result(Mutant("b.py", 3, "1 -> 0", ""), "timeout"),
    ]
    assert report(results, ["a.py", "b.py"]).splitlines() == [
        "module                   killed/total   score",
        "a.py                              1/2   50.0%",
        "b.py                              1/1  100.0%",
        "",
        "surviving mutants (1):",
        "  a.py:2: '<' -> '<=' in 'n < 10'",
        "",
        "score: 2/3 mutants killed (66.7%), 1 of them by timeout",
    ]


MODULE = """\
def countdown(n):
    while n > 0:
        n -= 1
    return n
"""

# Loose on purpose: it lets the count overshoot below zero, so some mutants survive.
TESTS = """\
from calc import countdown


def test_countdown_reaches_zero() -> None:
    assert countdown(3) <= 0
"""


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_run_judges_each_mutant_and_never_touches_the_project(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "calc.py").write_text(MODULE, encoding="utf-8")
    (project / "tests" / "test_calc.py").write_text(TESTS, encoding="utf-8")
    # A test file that never imports calc.py, and counts how often it runs.
    runs = tmp_path / "unrelated-runs.txt"
    (project / "tests" / "test_unrelated.py").write_text(
        f"def test_unrelated() -> None:\n    with open({str(runs)!r}, 'a') as f:\n"
        "        f.write('run\\n')\n",
        encoding="utf-8",
    )
    before = snapshot(project)
    messages: list[str] = []

    # 15 s: a mutant's whole pytest run must fit even on a loaded 2-core machine (5 s
    # did not); the two endless mutants cost that long once each, side by side.
    results = run_mutants(project, ["calc.py"], ["tests"], 2, 15.0, messages.append)

    outcomes = {(r.mutant.line, r.mutant.description): r.outcome for r in results}
    assert outcomes == {
        (2, "'>' -> '>=' in 'n > 0'"): "survived",
        (2, "'>' -> '<=' in 'n > 0'"): "killed",
        (2, "0 -> 1"): "killed",
        (2, "0 -> -1"): "survived",
        # Counting up (or down by nothing) never ends: stopped by the timeout.
        (3, "'-' -> '+' in 'n -= 1'"): "timeout",
        (3, "1 -> 2"): "survived",
        (3, "1 -> 0"): "timeout",
        (4, "return value 'n' -> None"): "killed",
    }
    assert snapshot(project) == before
    # The unrelated file ran once, unmutated, and was then left out.
    assert runs.read_text(encoding="utf-8") == "run\n"
    assert messages[0].startswith("calc.py: ")
    assert messages[0].endswith("s unmutated in test_calc.py")
    assert messages[1] == "8 mutants, 2 at a time"


# A test that reads the project's own file list from git, as tests/unit/test_references.py
# does, at the root of whatever copy of the project it runs in.
TRACKED_TESTS = """\
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_checkout_lists_its_files() -> None:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "calc.py" in listed
    assert "scratch.py" not in listed
"""


def test_a_test_that_asks_git_for_the_tracked_files_passes_in_the_copies(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "calc.py").write_text(MODULE, encoding="utf-8")
    (project / "tests" / "test_calc.py").write_text(TESTS, encoding="utf-8")
    (project / "tests" / "test_tracked.py").write_text(TRACKED_TESTS, encoding="utf-8")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "calc.py", "tests"], cwd=project, check=True)
    (project / "scratch.py").write_text("", encoding="utf-8")  # there, but not tracked
    messages: list[str] = []

    results = run_mutants(project, ["calc.py"], ["tests"], 1, 15.0, messages.append)

    assert len(results) == 8
    assert messages[1] == "8 mutants, 1 at a time"


def test_a_plain_run_covers_every_module_of_core() -> None:
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "core").glob("*.py")}
    assert modules - {"core/__init__.py"} <= set(DEFAULT_MODULES)
    assert "policies/templates.py" in DEFAULT_MODULES
