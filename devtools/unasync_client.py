"""Write the synchronous worker client (and its tests) from the asyncio one.

`python -m devtools.unasync_client` (`make unasync`) rewrites each target of `PAIRS`
from its async source; `--check` (part of `make lint`) writes nothing and fails while a
target differs from what this would write. The async code is the one copy a change is
made in: the two clients used to be kept by hand and drifted apart.

What the token table (`TOKENS`) cannot turn into sync code is marked in the source, on
lines of their own (a comment, so the async source runs and is checked as it is):

    # unasync: async
    ...lines for the async client only (left out of the sync one)...
    # unasync: sync
    # ...the sync client's lines in their place, each commented out once...
    # unasync: end

Either part may be left out (`async` ... `end`: async only; `sync` ... `end`: sync
only). Any other difference is the token table's, and a word of async code the table
does not know (`await`, `asyncio`, `Async...`) left in the sync output is an error.
The result goes through ruff: the imports only async code uses (asyncio, Awaitable) are
dropped and the rest sorted, and the code is formatted (a removed `await` can leave a
call that now fits on one line). So ruff (a dev dependency) is needed to generate, never
to run the client: this module is not part of the client's distribution, and the
generated file imports nothing from it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Pair:
    source: str  # relative to ROOT
    target: str


PAIRS = (
    Pair("client/fenceproxy_client/_async.py", "client/fenceproxy_client/_sync.py"),
    Pair("tests/client/test_async_client.py", "tests/client/test_sync_client.py"),
)

# Whole words (identifiers and dotted names), replaced everywhere outside the markers:
# in code, comments and docstrings alike.
TOKENS = {
    "AsyncFenceClient": "FenceClient",
    "AsyncLeaseScope": "LeaseScope",
    "AsyncLease": "Lease",
    "AsyncOnLost": "OnLost",
    "httpx.AsyncClient": "httpx.Client",
    "httpx.AsyncBaseTransport": "httpx.BaseTransport",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "aclose": "close",
    "asyncio.sleep": "time.sleep",  # so the async source imports time as well
}
# `async def` -> `def`, `async with` -> `with`, `async for` -> `for`, `await x` -> `x`.
KEYWORDS = re.compile(r"\basync\s+(?=def\b|with\b|for\b)|\bawait\s+")
_LONGEST_FIRST = sorted(TOKENS, key=len, reverse=True)
_WORDS = re.compile(r"(?<!\w)(" + "|".join(map(re.escape, _LONGEST_FIRST)) + r")(?!\w)")
# What must not survive into sync code: a line with one of these was missed by the table
# and needs a marker.
LEFT_OVER = re.compile(r"\b(await|async|asyncio|aclose|Async\w*|__a(?:enter|exit)__)\b")

MARKER = re.compile(r"^\s*# unasync:\s*(\S*)\s*$")


class UnasyncError(Exception):
    pass


def unasync_text(source: str, source_name: str) -> str:
    """The sync code of `source`, before formatting."""
    out: list[str] = []
    block = ""  # "", "async" or "sync"
    for number, line in enumerate(source.splitlines(), 1):
        where = f"{source_name}:{number}"
        marker = MARKER.match(line)
        if marker:
            kind = marker.group(1)
            expected = {"": ("async", "sync"), "async": ("sync", "end"), "sync": ("end",)}[block]
            if kind not in expected:
                raise UnasyncError(f"{where}: `# unasync: {kind}` where {expected} was expected")
            block = "" if kind == "end" else kind
            continue
        if block == "async":
            continue
        if block == "sync":
            stripped = line.lstrip()
            indent = line[: len(line) - len(stripped)]
            if stripped == "#":
                line = ""
            elif stripped.startswith("# "):
                line = indent + stripped[2:]
            else:
                raise UnasyncError(f"{where}: a sync line must be commented out: {line!r}")
        else:
            line = _WORDS.sub(lambda m: TOKENS[m.group(1)], KEYWORDS.sub("", line))
        out.append(line)
    if block:
        raise UnasyncError(f"{source_name}: `# unasync: {block}` is never ended")
    return "\n".join(out) + "\n"


def header(pair: Pair) -> str:
    return (
        f"# GENERATED from {pair.source} by devtools/unasync_client.py: do not edit.\n"
        "# Change the async source and run `make unasync`; `make lint` fails while this\n"
        "# file differs from what the generator writes.\n"
    )


def ruff(args: list[str], code: str, filename: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", filename, "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise UnasyncError(f"ruff {args[0]} failed on the sync code of {filename}: {done.stderr}")
    return done.stdout


def join_nested_withs(code: str) -> str:
    """`with a:` holding only `with b:` made one `with (a, b):`, as ruff's SIM117 wants.
    The async source cannot be written so (`async with client:` around `with
    pytest.raises(...)`), and ruff's own fix gives up when the line gets too long."""
    while True:
        lines = code.splitlines(keepends=True)
        for node in ast.walk(ast.parse(code)):
            if not (
                isinstance(node, ast.With)
                and len(node.body) == 1
                and isinstance(node.body[0], ast.With)
            ):
                continue
            inner = node.body[0]
            outer_head, inner_head = lines[node.lineno - 1], lines[inner.lineno - 1]
            body = lines[inner.lineno : inner.end_lineno]
            indent = outer_head[: len(outer_head) - len(outer_head.lstrip())]
            one_line_heads = (
                inner.lineno == node.lineno + 1
                and inner.body[0].lineno == inner.lineno + 1
                and outer_head.rstrip().endswith(":")
                and inner_head.rstrip().endswith(":")
            )
            if not one_line_heads or any(
                line.strip() and not line.startswith(indent + " " * 8) for line in body
            ):
                continue  # left as it is: ruff check then names it
            items = f"{outer_head.strip()[5:-1]}, {inner_head.strip()[5:-1]}"
            joined = [f"{indent}with ({items}):\n"] + [
                line[4:] if line.strip() else line for line in body
            ]
            lines[node.lineno - 1 : inner.end_lineno] = joined
            code = "".join(lines)
            break
        else:
            return code


def tidy(code: str, filename: str) -> str:
    """Nested `with`s joined, the imports the sync code no longer uses dropped (asyncio,
    Awaitable) and the rest sorted, and the code formatted as `make lint` wants it."""
    code = join_nested_withs(code)
    fixed = ruff(["check", "--select", "I,F401", "--fix", "--exit-zero", "--quiet"], code, filename)
    return ruff(["format"], fixed, filename)


def generate(pair: Pair, root: Path = ROOT) -> str:
    source = (root / pair.source).read_text()
    code = tidy(header(pair) + unasync_text(source, pair.source), pair.target)
    head = header(pair).count("\n")
    for number, line in enumerate(code.splitlines()[head:], head + 1):
        left = LEFT_OVER.search(line)
        if left:
            raise UnasyncError(
                f"{pair.target}:{number}: {left.group(1)!r} left in the sync code: "
                f"extend the token table or mark its line in {pair.source}"
            )
    return code


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; fail if a target differs"
    )
    args = parser.parse_args(argv)
    stale = []
    for pair in PAIRS:
        try:
            wanted = generate(pair, root)
        except UnasyncError as failed:
            print(failed, file=sys.stderr)
            return 2
        target = root / pair.target
        current = target.read_text() if target.exists() else ""
        if current == wanted:
            continue
        if args.check:
            stale.append(pair.target)
            sys.stderr.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    wanted.splitlines(keepends=True),
                    pair.target,
                    f"{pair.target} (as generated from {pair.source})",
                )
            )
        else:
            target.write_text(wanted)
            print(f"wrote {pair.target}")
    if stale:
        print(
            f"{', '.join(stale)}: not what devtools/unasync_client.py writes from the async "
            "source; edit the async file and run `make unasync`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
