"""What the repository's comments and docs point a reader to is there: a file path they
name exists, and no text cites an issue number (a tracker the reader of the repository
cannot see; the comment says the reason instead)."""

from __future__ import annotations

import ast
import glob
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# `python -m`-able files and what a reader opens: a path to one names its extension.
_EXTENSIONS = "py|sql|md|yaml|yml|toml|json|html|css|js|png|sh|txt|cfg|service|conf|pem"
_HASH_COMMENTED = (".toml", ".yaml", ".yml", ".sh", ".cfg", ".conf", ".service")
_ISSUE = re.compile(r"\bissue [0-9]+", re.IGNORECASE)


def _tracked() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def _path_pattern(tracked: list[str]) -> re.Pattern[str]:
    """A repo-relative path: a top-level folder of the repository, then a file with an
    extension (or a glob of them), or a folder ending in '/'; not a part of a longer path
    (`../store/x.py`, `a/store/x.py`) nor a template (`docs/{name}.md`)."""
    tops = sorted({name.split("/")[0] for name in tracked if "/" in name})
    folders = "|".join(re.escape(top) for top in tops)
    return re.compile(
        rf"(?<![\w./{{-])((?:{folders})/(?:[\w.*-]+/)*(?:[\w*-]+\.(?:{_EXTENSIONS})\b|(?=\s|`|$)))"
    )


def _python_notes(text: str) -> Iterator[tuple[int, str]]:
    """A Python file's comments and docstrings, each with its first line."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                yield body[0].lineno, body[0].value.value


def _notes(name: str, text: str) -> Iterator[tuple[int, str]]:
    """What of a file a reader reads as prose: Python's comments and docstrings, SQL's
    `--` comments, the `#` comments of a Makefile or a configuration file, and all of a
    Markdown page."""
    if name.endswith(".py"):
        yield from _python_notes(text)
    elif name.endswith(".md"):
        yield from enumerate(text.splitlines(), 1)
    else:
        marker = "--" if name.endswith(".sql") else "#"
        if marker == "#" and not (name.endswith(_HASH_COMMENTED) or name.endswith("Makefile")):
            return
        for number, line in enumerate(text.splitlines(), 1):
            if marker in line:
                yield number, line[line.index(marker) :]


def _exists(path: str) -> bool:
    if "*" in path:
        return bool(glob.glob(path, root_dir=ROOT))
    return (ROOT / path).exists()


def test_every_path_a_comment_or_a_page_names_exists() -> None:
    tracked = _tracked()
    pattern = _path_pattern(tracked)
    missing = []
    for name in tracked:
        if not (
            name.endswith((".py", ".md", ".sql", *_HASH_COMMENTED)) or name.endswith("Makefile")
        ):
            continue
        text = (ROOT / name).read_text(encoding="utf-8")
        # Read as prose only where some path is missing: tokenizing every file is slow.
        if all(_exists(path.rstrip("/")) for path in pattern.findall(text)):
            continue
        missing += [
            f"{name}:{line}: {path}"
            for line, note in _notes(name, text)
            for path in pattern.findall(note)
            if not _exists(path.rstrip("/"))
        ]
    assert missing == []


def test_the_path_pattern_finds_what_a_reader_would_open() -> None:
    pattern = _path_pattern(["store/a.py", "docs/b.md", "tests/unit/c.py"])
    assert pattern.findall("see store/queries.py, docs/how-to/x.md and store/*.sql") == [
        "store/queries.py",
        "docs/how-to/x.md",
        "store/*.sql",
    ]
    assert pattern.findall("under tests/integration/app/ (both backends)") == [
        "tests/integration/app/"
    ]
    assert pattern.findall("../store/x.py, proxy/store/y.py, docs/{name}.md, store.x") == []


def test_no_text_cites_an_issue_number() -> None:
    citing = [
        f"{name}:{number}: {line.strip()}"
        for name in _tracked()
        if not name.endswith(".png")
        for number, line in enumerate(
            (ROOT / name).read_text(encoding="utf-8", errors="replace").splitlines(), 1
        )
        if _ISSUE.search(line)
    ]
    assert citing == []
