"""The releases this checkout follows (releases.toml), and the previous one built from
its recorded commit into a virtualenv of its own.

The commit is what is built, not the tag: a clone may have no tags. It is checked out
with `git worktree add --detach` into a temporary folder, built into a wheel with this
checkout's build tools, and installed into a fresh virtualenv (its dependencies from the
package index, as a user would install it). The virtualenv is kept under
`.cache/releases/` (ignored by git), keyed by the commit, so later runs start at once; a
file named `complete` is written into it last, so a build cut short is built again.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.releases import older

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "releases"
BUILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Release:
    version: str
    tag: str
    commit: str


def recorded_releases() -> list[Release]:
    data = tomllib.loads((ROOT / "releases.toml").read_text(encoding="utf-8"))
    return [Release(r["version"], r["tag"], r["commit"]) for r in data["release"]]


def this_version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    version: str = project["version"]
    return version


def previous_release() -> Release:
    """The newest recorded release older than this checkout's version."""
    current = this_version()
    earlier = [r for r in recorded_releases() if older(r.version, current)]
    if not earlier:
        raise LookupError(f"releases.toml lists no release before {current}")
    return earlier[-1]


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )


@contextlib.contextmanager
def _building() -> Iterator[None]:
    """One build at a time in this cache (two test runs may start together)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def installed(release: Release) -> Path:
    """The `fenceproxy` command of `release`, built once per commit."""
    with _building():
        return _build(release)


def _build(release: Release) -> Path:
    venv = CACHE / f"{release.version}-{release.commit}"
    command = venv / "bin" / "fenceproxy"
    complete = venv / "complete"
    if complete.exists():
        return command
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{release.commit}^{{commit}}"], cwd=ROOT, check=False
    )
    if known.returncode != 0:
        raise RuntimeError(
            f"commit {release.commit} of {release.tag} is not in this clone: fetch the "
            "full history (git fetch --unshallow)"
        )
    shutil.rmtree(venv, ignore_errors=True)  # a build cut short
    with tempfile.TemporaryDirectory(prefix="fenceproxy-release-") as scratch:
        source = Path(scratch) / "source"
        wheels = Path(scratch) / "wheels"
        _run(["git", "worktree", "add", "--detach", str(source), release.commit], ROOT)
        try:
            build = ["pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
            _run([sys.executable, "-m", *build, "--wheel-dir", str(wheels), str(source)], ROOT)
        finally:
            _run(["git", "worktree", "remove", "--force", str(source)], ROOT)
        (wheel,) = wheels.glob("fenceproxy-*.whl")
        _run([sys.executable, "-m", "venv", str(venv)], ROOT)
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)], ROOT)
    complete.write_text(f"{release.tag} {release.commit}\n")
    return command
