"""Mutation testing of the pure rule modules: offline, deterministic, self-contained.

A mutant is one small change to one module: a comparison flipped, an operator
swapped, a constant moved, a call or a `raise` dropped, a return value replaced.
The unit tests run against each mutant; a mutant they pass on (a survivor) is a
behaviour no test pins down. Mutants are generated from the AST in source order,
so two runs on the same tree try the same mutants.

Mutants are written into temporary copies of the project, never into the working
tree: an interrupted run (Ctrl-C, a killed terminal) has nothing to restore.

    python -m devtools.mutate [MODULE ...] [--tests PATH ...] [--jobs N] [--timeout S]
                              [--match TEXT] [--list]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODULES = (
    "policies/templates.py",
    "core/fencing.py",
    "core/probing.py",
    "core/outcomes.py",
    "core/lifecycle.py",
)
DEFAULT_TESTS = ("tests/unit",)

# Not copied into the workspaces: environments, caches and state the tests do not read.
_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "state", "*.db*"
)

_CMP_SYMBOLS: dict[type[ast.cmpop], str] = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
# Each comparison gets its off-by-one boundary and its negation.
_CMP_SWAPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
_BINOP_SYMBOLS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
_CALL_SWAPS = {"min": "max", "max": "min", "all": "any", "any": "all"}


@dataclass(frozen=True)
class Mutant:
    module: str  # relative to the project root, '/'-separated
    line: int
    description: str
    source: str  # the whole mutated module

    def label(self) -> str:
        return f"{self.module}:{self.line}: {self.description}"


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    outcome: str  # "killed", "timeout" (counted as killed) or "survived"


# --- generating mutants -----------------------------------------------------------------


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _code(node: ast.AST, source: str) -> str:
    """The code a mutant changes, as written, short enough for one report line."""
    text = ast.get_source_segment(source, node) or ast.unparse(node)
    # One line: a call split over lines reads `f(a, b)`, not `f( a, b, )`.
    text = re.sub(r"\s*\n\s*", " ", text)
    text = re.sub(r"([(\[{]) ", r"\1", re.sub(r",? ([)\]}])", r"\1", text))
    return repr(text if len(text) <= 50 else text[:47] + "...")


def _constant_changes(value: object) -> list[tuple[str, bool | int | float | str]]:
    if isinstance(value, bool):
        return [(f"{value} -> {not value}", not value)]
    changes: list[int | float | str]
    if isinstance(value, int):
        changes = [value + 1, value - 1]
    elif isinstance(value, float):
        changes = [value * 2 if value else 1.0, value + 1]
    elif isinstance(value, str):
        changes = ["" if value else "mutant"]
    else:
        return []
    return [(f"{_show(value)} -> {_show(new)}", new) for new in changes if new != value]


def _candidates(node: ast.AST, source: str) -> list[tuple[str, ast.AST]]:
    """(description, replacement) for each mutant of `node` itself."""
    found: list[tuple[str, ast.AST]] = []
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            for new_op in _CMP_SWAPS.get(type(op), ()):
                ops = [*node.ops[:index], new_op(), *node.ops[index + 1 :]]
                change = f"'{_CMP_SYMBOLS[type(op)]}' -> '{_CMP_SYMBOLS[new_op]}'"
                mutated = ast.Compare(left=node.left, ops=ops, comparators=node.comparators)
                found.append((f"{change} in {_code(node, source)}", mutated))
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BINOP_SWAPS:
        old, new = type(node.op), _BINOP_SWAPS[type(node.op)]
        description = f"'{_BINOP_SYMBOLS[old]}' -> '{_BINOP_SYMBOLS[new]}' in {_code(node, source)}"
        if isinstance(node, ast.BinOp):
            found.append((description, ast.BinOp(left=node.left, op=new(), right=node.right)))
        else:
            found.append((description, ast.AugAssign(node.target, new(), node.value)))
    elif isinstance(node, ast.BoolOp):
        new_bool: ast.boolop = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        names = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        description = f"'{names[0]}' -> '{names[1]}' in {_code(node, source)}"
        found.append((description, ast.BoolOp(op=new_bool, values=node.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
        symbol = "not" if isinstance(node.op, ast.Not) else "-"
        found.append((f"'{symbol}' removed in {_code(node, source)}", node.operand))
    elif isinstance(node, ast.Constant):
        for description, value in _constant_changes(node.value):
            found.append((description, ast.Constant(value)))
    elif isinstance(node, ast.JoinedStr):
        found.append(("f-string -> ''", ast.Constant("")))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        swapped = _CALL_SWAPS.get(node.func.id)
        if swapped is not None:
            call = ast.Call(
                func=ast.Name(swapped, ast.Load()), args=node.args, keywords=node.keywords
            )
            found.append((f"{node.func.id}() -> {swapped}() in {_code(node, source)}", call))
    elif isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            description = f"return value {_code(node.value, source)} -> None"
            found.append((description, ast.Return(ast.Constant(None))))
    elif isinstance(node, ast.Raise):
        found.append(("raise removed", ast.Pass()))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        found.append((f"call to {ast.unparse(node.value.func)}() removed", ast.Pass()))
    elif (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Await)
        and isinstance(node.value.value, ast.Call)
    ):
        # The store's steps are awaited calls (`await tx.execute("raise_epoch_floor", ...)`):
        # named with their arguments, which say which step it is.
        found.append((f"awaited call {_code(node.value.value, source)} removed", ast.Pass()))
    return found


def _is_plain_condition(node: ast.AST) -> bool:
    """A truth test that no other mutant already negates (`if x:`, not `if a < b:`)."""
    if isinstance(node, ast.Compare | ast.BoolOp):
        return False
    return not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not))


@dataclass
class _Site:
    parent: ast.AST
    field: str
    index: int | None
    replacement: ast.AST
    description: str
    line: int

    def put(self, node: ast.AST) -> None:
        if self.index is None:
            setattr(self.parent, self.field, node)
        else:
            getattr(self.parent, self.field)[self.index] = node


def _slots(node: ast.AST) -> Iterator[tuple[str, int | None, ast.AST]]:
    """The children of `node` worth mutating, with where each sits."""
    for field, value in ast.iter_fields(node):
        # Annotations are not evaluated (PEP 563) and decorators declare rather than decide.
        if field in ("annotation", "returns", "decorator_list", "format_spec"):
            continue
        # An f-string's literal parts are mutated as one (the whole f-string -> '').
        if isinstance(node, ast.JoinedStr):
            continue
        if isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, ast.AST):
                    yield field, index, item
        elif isinstance(value, ast.AST):
            yield field, None, value
    if isinstance(node, ast.JoinedStr):
        for index, part in enumerate(node.values):
            if isinstance(part, ast.FormattedValue):
                yield "values", index, part


def _find_sites(parent: ast.AST, source: str, sites: list[_Site]) -> None:
    for field, index, child in _slots(parent):
        # Docstrings and bare constants do nothing; asserts only narrow types here.
        if isinstance(child, ast.Assert):
            continue
        if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
            continue
        line = getattr(child, "lineno", getattr(parent, "lineno", 0))
        for description, replacement in _candidates(child, source):
            sites.append(_Site(parent, field, index, replacement, description, line))
        is_test = field == "test" and isinstance(parent, ast.If | ast.IfExp | ast.While)
        is_test = is_test or (field == "ifs" and isinstance(parent, ast.comprehension))
        if is_test and isinstance(child, ast.expr) and _is_plain_condition(child):
            negated = ast.UnaryOp(ast.Not(), child)
            description = f"condition {_code(child, source)} negated"
            sites.append(_Site(parent, field, index, negated, description, line))
        _find_sites(child, source, sites)


def generate_mutants(module: str, source: str) -> list[Mutant]:
    """Every distinct mutant of `source`, in source order."""
    tree = ast.parse(source)
    sites: list[_Site] = []
    _find_sites(tree, source, sites)
    seen = {ast.unparse(tree)}
    mutants = []
    for site in sorted(sites, key=lambda s: s.line):
        original = getattr(site.parent, site.field)
        if site.index is not None:
            original = original[site.index]
        site.put(site.replacement)
        try:
            mutated = ast.unparse(tree)
        finally:
            site.put(original)
        if mutated in seen:  # same program as the original or as an earlier mutant
            continue
        seen.add(mutated)
        compile(mutated, module, "exec")
        mutants.append(Mutant(module, site.line, site.description, mutated))
    return mutants


# --- running the tests against each mutant ----------------------------------------------


def _dotted(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def test_files(root: Path, tests: Sequence[str]) -> list[str]:
    """The test files named by `tests` (files, or folders searched for test_*.py)."""
    files: list[str] = []
    for entry in tests:
        path = root / entry
        if path.is_dir():
            files.extend(str(p.relative_to(root)) for p in sorted(path.rglob("test_*.py")))
        else:
            files.append(entry)
    return files


# Runs pytest in-process, then writes down which of the given modules the tests loaded.
_BASELINE = """\
import sys, pytest
code = pytest.main(sys.argv[3:])
loaded = [name for name in sys.argv[2].split(",") if name in sys.modules]
with open(sys.argv[1], "w") as report:
    report.write(" ".join(loaded))
sys.exit(code)
"""


@dataclass(frozen=True)
class Baseline:
    """One test file, run on the unmutated modules."""

    test_file: str
    passed: bool
    output: str
    seconds: float
    loaded: frozenset[str]  # the modules under test it imported


class Runner:
    """Runs pytest in workspaces (copies of the project), one run per workspace at a time."""

    def __init__(self, root: Path, base: Path, jobs: int) -> None:
        self.base = base
        self.workspaces: queue.Queue[Path] = queue.Queue()
        self.running: set[subprocess.Popen[bytes]] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        for number in range(jobs):
            workspace = base / f"workspace-{number}"
            shutil.copytree(root, workspace, ignore=_IGNORE)
            self.workspaces.put(workspace)

    def _env(self, workspace: Path) -> dict[str, str]:
        env = dict(os.environ)
        # Without bytecode files a mutant of the same size written in the same second
        # as the previous one cannot be shadowed by the previous one's stale .pyc.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONHASHSEED"] = "0"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workspace), env.get("PYTHONPATH")]))
        return env

    def check_imports(self, modules: Sequence[str]) -> None:
        """Fail unless every workspace imports its own copy of each module (and not, say,
        the editable install's), or every mutant would survive unseen."""
        script = (
            "import importlib, sys\n"
            "for name in sys.argv[1:]: print(importlib.import_module(name).__file__)"
        )
        for workspace in list(self.workspaces.queue):
            names = [_dotted(m) for m in modules]
            output = subprocess.run(
                [sys.executable, "-c", script, *names],
                cwd=workspace,
                env=self._env(workspace),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            for module, imported in zip(modules, output, strict=True):
                if Path(imported).resolve() != (workspace / module).resolve():
                    raise SystemExit(f"mutate: {module} is imported from {imported}, not the copy")

    def baseline(self, files: dict[str, str], test_file: str, modules: Sequence[str]) -> Baseline:
        """Run `test_file` with `files` written in, noting which `modules` it loads."""
        report = self.base / f"loaded-{threading.get_ident()}.txt"
        names = ",".join(_dotted(m) for m in modules)
        argv = ["-c", _BASELINE, str(report), names, "-q", "-p", "no:cacheprovider", test_file]
        started = time.monotonic()
        outcome, output = self.run(files, argv, None)
        seconds = time.monotonic() - started
        loaded = frozenset(report.read_text(encoding="utf-8").split()) if report.exists() else None
        report.unlink(missing_ok=True)
        if loaded is None:  # pytest itself failed before the tests ran
            return Baseline(test_file, False, output, seconds, frozenset())
        return Baseline(test_file, outcome == "survived", output, seconds, loaded)

    def run(
        self, files: dict[str, str], argv: Sequence[str], timeout: float | None
    ) -> tuple[str, str]:
        """Write `files` (path -> text) into a free workspace, run `python argv`, restore.

        Returns the outcome (killed, timeout, survived) and the output."""
        workspace = self.workspaces.get()
        originals = {module: (workspace / module).read_bytes() for module in files}
        try:
            for module, text in files.items():
                (workspace / module).write_text(text, encoding="utf-8")
            return self._python(workspace, argv, timeout)
        finally:
            for module, content in originals.items():
                (workspace / module).write_bytes(content)
            self.workspaces.put(workspace)

    def _python(
        self, workspace: Path, argv: Sequence[str], timeout: float | None
    ) -> tuple[str, str]:
        if self.stopping.is_set():
            raise KeyboardInterrupt
        process = subprocess.Popen(
            [sys.executable, *argv],
            cwd=workspace,
            env=self._env(workspace),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a timeout kills all it started
        )
        with self.lock:
            self.running.add(process)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.communicate()
            return "timeout", ""
        finally:
            with self.lock:
                self.running.discard(process)
        text = output.decode(errors="replace")
        if process.returncode == 0:
            return "survived", text
        # 4: bad usage, 5: no tests collected. Either way the tests never judged the mutant.
        if process.returncode in (4, 5):
            raise SystemExit(f"mutate: pytest could not run the tests:\n{text}")
        return "killed", text

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            for process in self.running:
                _kill_group(process)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    # The group may be gone already: the run ended between the check and the kill.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_mutants(
    root: Path,
    modules: Sequence[str],
    tests: Sequence[str],
    jobs: int,
    timeout: float | None,
    progress: Callable[[str], None],
    match: str | None = None,
) -> list[Result]:
    """Every mutant of `modules` (those whose description contains `match`, if given),
    each judged by the test files that load its module.

    A test file that never imports a module cannot see its mutants, so it is not run
    for them: that keeps a run to minutes, and unrelated tests (a timing-sensitive
    server test, say) cannot kill a mutant by chance. Tests that use a module only in
    a child process do not count as loading it. Results come in source order."""
    mutants = [
        m
        for module in modules
        for m in generate_mutants(module, _read(root, module))
        if match is None or match in m.description
    ]
    files = test_files(root, tests)
    with tempfile.TemporaryDirectory(prefix="fenceproxy-mutate-") as base:
        runner = Runner(root, Path(base), jobs)
        runner.check_imports(modules)
        # The mutants are written as ast.unparse output; the tests must pass on the
        # unparsed originals, so that only the mutation itself can fail them.
        unparsed = {m: ast.unparse(ast.parse(_read(root, m))) for m in modules}
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            try:
                baselines = list(pool.map(lambda f: runner.baseline(unparsed, f, modules), files))
                plans = _plan(root, modules, baselines, timeout, progress)
                progress(f"{len(mutants)} mutants, {jobs} at a time")
                judge = _Judge(runner, plans, len(mutants), progress)
                futures = [pool.submit(judge, mutant) for mutant in mutants]
                return [future.result() for future in futures]
            except BaseException:
                runner.stop()
                pool.shutdown(cancel_futures=True)
                raise


@dataclass(frozen=True)
class _Plan:
    test_files: tuple[str, ...]  # those naming the module first, so -x stops sooner
    timeout: float


def _plan(
    root: Path,
    modules: Sequence[str],
    baselines: Sequence[Baseline],
    timeout: float | None,
    progress: Callable[[str], None],
) -> dict[str, _Plan]:
    for failed in (b for b in baselines if not b.passed):
        raise SystemExit(f"mutate: {failed.test_file} fails without any mutant:\n{failed.output}")
    plans = {}
    for module in modules:
        name = _dotted(module)
        loading = [b for b in baselines if name in b.loaded]
        ordered = sorted(
            (b.test_file for b in loading),
            key=lambda f: name not in (root / f).read_text(encoding="utf-8"),
        )
        seconds = sum(b.seconds for b in loading)
        # Ten times the unmutated run: only a mutant that hangs gets near it.
        limit = timeout if timeout is not None else max(30.0, 10 * seconds)
        plans[module] = _Plan(tuple(ordered), limit)
        shown = ", ".join(Path(f).name for f in ordered) or "none: its mutants all survive"
        progress(f"{module}: {seconds:.1f}s unmutated in {shown}")
    return plans


class _Judge:
    """Runs one mutant against its module's test files; counts progress."""

    def __init__(
        self, runner: Runner, plans: dict[str, _Plan], total: int, progress: Callable[[str], None]
    ) -> None:
        self.runner = runner
        self.plans = plans
        self.total = total
        self.progress = progress
        self.done = 0

    def __call__(self, mutant: Mutant) -> Result:
        plan = self.plans[mutant.module]
        outcome = "survived"
        if plan.test_files:
            argv = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *plan.test_files]
            outcome, _ = self.runner.run({mutant.module: mutant.source}, argv, plan.timeout)
        with self.runner.lock:
            self.done += 1
            if self.done % 25 == 0 or self.done == self.total:
                self.progress(f"{self.done}/{self.total} mutants run")
        return Result(mutant, outcome)


def _read(root: Path, module: str) -> str:
    return (root / module).read_text(encoding="utf-8")


def report(results: Sequence[Result], modules: Sequence[str]) -> str:
    """Killed/total per module, each survivor as `file:line: change`, and the total."""
    lines = [f"{'module':<24} {'killed/total':>12} {'score':>7}"]
    for module in modules:
        of_module = [r for r in results if r.mutant.module == module]
        killed = sum(r.outcome != "survived" for r in of_module)
        counts = f"{killed}/{len(of_module)}"
        lines.append(f"{module:<24} {counts:>12} {_percent(killed, len(of_module)):>7}")
    survivors = [r.mutant for r in results if r.outcome == "survived"]
    timeouts = sum(r.outcome == "timeout" for r in results)
    killed = len(results) - len(survivors)
    lines.append("")
    lines.append(f"surviving mutants ({len(survivors)}):" if survivors else "no surviving mutants")
    lines.extend(f"  {mutant.label()}" for mutant in survivors)
    lines.append("")
    by_timeout = f", {timeouts} of them by timeout" if timeouts else ""
    lines.append(
        f"score: {killed}/{len(results)} mutants killed ({_percent(killed, len(results))})"
        + by_timeout
    )
    return "\n".join(lines)


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.mutate", description=__doc__)
    parser.add_argument("modules", nargs="*", default=list(DEFAULT_MODULES), metavar="MODULE")
    parser.add_argument("--tests", action="append", help="test file or folder (default tests/unit)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, help="seconds per mutant (default: 10x baseline)")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--match", help="only the mutants whose description contains TEXT")
    args = parser.parse_args(argv)
    modules: list[str] = args.modules
    for module in modules:
        if not (ROOT / module).is_file():
            parser.error(f"no such module: {module}")
    if args.list:
        for module in modules:
            for mutant in generate_mutants(module, _read(ROOT, module)):
                if args.match is None or args.match in mutant.description:
                    print(mutant.label())
        return 0
    started = time.monotonic()
    try:
        results = run_mutants(
            ROOT,
            modules,
            args.tests or list(DEFAULT_TESTS),
            max(1, args.jobs),
            args.timeout,
            lambda message: print(f"mutate: {message}", file=sys.stderr, flush=True),
            args.match,
        )
    except KeyboardInterrupt:
        print("mutate: interrupted; the working tree was never modified", file=sys.stderr)
        return 130
    print(report(results, modules))
    print(f"run time: {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
