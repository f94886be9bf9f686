"""Mutation testing of the pure rule modules: offline, deterministic, self-contained.

A mutant is one small change to one module: a comparison flipped, an operator
swapped, a constant moved, a call or a `raise` dropped, a return value replaced.
The unit tests run against each mutant; a mutant they pass on (a survivor) is a
behaviour no test pins down. Mutants are generated from the AST in source order
(devtools/mutants.py), so two runs on the same tree try the same mutants.

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
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from devtools.mutants import Mutant, generate_mutants

ROOT = Path(__file__).resolve().parents[1]
# Every module of core/ (the records and the pure rules), found rather than listed so
# that a new one is covered from its first run, and the route templates.
DEFAULT_MODULES = (
    "policies/templates.py",
    *sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "core").glob("*.py")
        if path.name != "__init__.py"
    ),
)
DEFAULT_TESTS = ("tests/unit",)

# Not copied into the workspaces: environments, caches and state the tests do not read.
_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "state", "*.db*"
)


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    outcome: str  # "killed", "timeout" (counted as killed) or "survived"


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
        tracked = _tracked_files(root)
        for number in range(jobs):
            workspace = base / f"workspace-{number}"
            shutil.copytree(root, workspace, ignore=_IGNORE)
            if tracked is not None:
                _track(workspace, tracked)
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


def _tracked_files(root: Path) -> list[str] | None:
    """The files git tracks in `root`, or None when `root` is no git checkout."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True)
    if listed.returncode != 0:
        return None
    return [name for name in listed.stdout.decode().split("\0") if name]


def _track(workspace: Path, tracked: Sequence[str]) -> None:
    """Make `workspace` a git repository whose index lists the `tracked` files it holds.

    The copies leave .git out (a worktree's is a pointer to the main checkout's, and a
    clone's can be large), yet the tests may ask git which files the project has
    (tests/unit/test_references.py does): without an index of their own they would fail
    in every copy before any mutant is tried. Only the index is written, no commit."""
    subprocess.run(["git", "init", "-q"], cwd=workspace, capture_output=True, check=True)
    present = [name for name in tracked if (workspace / name).is_file()]
    subprocess.run(
        ["git", "update-index", "--add", "-z", "--stdin"],
        cwd=workspace,
        input="\0".join(present).encode(),
        capture_output=True,
        check=True,
    )


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
