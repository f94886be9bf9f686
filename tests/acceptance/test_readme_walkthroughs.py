"""The walkthroughs, pasted as a newcomer would paste them, against `make run`.

The first is README.md's (the docs site includes it from there); the second,
docs/tutorials/outcome-unknown.md, goes on from it in the same shell. The convention,
which README.md states where the first walkthrough begins:

* every ```sh block under a README `## Walkthrough...` heading, then every ```sh block
  of the tutorial page, is run, all of them in order, in one bash (so variables and
  functions carry over), with stderr joined to stdout;
* a command is a line that is neither blank nor a comment, with its `\\` continuations;
* a `#> text` line shows output of the command above it. The command's output must
  hold every such line, in that order, though not only them (a `curl -i` prints more
  headers than are shown). `...` matches anything, and runs of spaces count as one
  (a table's columns widen with their contents).

The proxy and the demo upstream are `make run`'s own processes (demo/run_example.py),
on free ports and a fresh state directory; the walkthroughs' 8080 and 9001 are replaced
by those ports. The shell runs where `state/` is that directory, as the walkthroughs'
`state/fenceproxy.yaml` expects; the second walkthrough itself puts the virtualenv's
`fenceproxy` on PATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.processes import ManagedProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Goes on from README's walkthrough, in the same shell.
SECOND_WALKTHROUGH = ROOT / "docs" / "tutorials" / "outcome-unknown.md"
WALKTHROUGH_PORT = "127.0.0.1:8080"
WALKTHROUGH_UPSTREAM_PORT = "127.0.0.1:9001"
OUTPUT_MARK = "#>"
# Between commands: a line no command prints.
BOUNDARY = "@@walkthrough-command-{}@@"
# The walkthrough waits 6 s for a lease to expire and a second or so for a probe.
SCRIPT_TIMEOUT_S = 60.0
STARTUP_TIMEOUT_S = 30.0


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def walkthrough_blocks(readme: str) -> list[str]:
    blocks = []
    for section in re.split(r"^## ", readme, flags=re.MULTILINE):
        if section.startswith("Walkthrough"):
            blocks += shell_blocks(section)
    return blocks


def walkthroughs() -> list[str]:
    """README's walkthrough blocks, then the second walkthrough's."""
    readme = walkthrough_blocks(README.read_text(encoding="utf-8"))
    return readme + shell_blocks(SECOND_WALKTHROUGH.read_text(encoding="utf-8"))


def commands_of(blocks: list[str]) -> list[Command]:
    commands: list[Command] = []
    continued = False
    for line in "\n".join(blocks).splitlines():
        stripped = line.strip()
        if continued:
            commands[-1].text += "\n" + line
        elif stripped.startswith(OUTPUT_MARK):
            assert commands, f"output shown before any command: {line!r}"
            commands[-1].expected.append(stripped[len(OUTPUT_MARK) :].strip())
        elif stripped and not stripped.startswith("#"):
            commands.append(Command(line))
        continued = stripped.endswith("\\") and not stripped.startswith("#")
    return commands


def script_of(commands: list[Command], port: int, upstream_port: int) -> str:
    lines = ["exec 2>&1"]
    for index, command in enumerate(commands):
        # printf, not echo: the previous command's output may not end its last line.
        lines.append(f"printf '\\n{BOUNDARY.format(index)}\\n'")
        lines.append(
            command.text.replace(WALKTHROUGH_PORT, f"127.0.0.1:{port}").replace(
                WALKTHROUGH_UPSTREAM_PORT, f"127.0.0.1:{upstream_port}"
            )
        )
    return "\n".join(lines) + "\n"


def outputs_of(printed: str, count: int) -> list[str]:
    outputs = []
    for index in range(count):
        marker = BOUNDARY.format(index)
        assert marker in printed, f"the script stopped before command {index}:\n{printed}"
        after = printed.split(marker, 1)[1]
        outputs.append(after.split(BOUNDARY.format(index + 1), 1)[0])
    return outputs


def _squeezed(text: str) -> str:
    return " ".join(text.split())


def line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in _squeezed(expected).split("...")))


def missing_lines(expected: list[str], output: str) -> list[str]:
    """The expected lines the output does not hold in order (all of them from the first
    one not found)."""
    printed: Iterator[str] = iter(_squeezed(line) for line in output.splitlines())
    for position, line in enumerate(expected):
        pattern = line_pattern(line)
        if not any(pattern.fullmatch(candidate) for candidate in printed):
            return expected[position:]
    return []


def test_the_conventions_read_commands_continuations_and_output() -> None:
    block = (
        "X=1   # a comment on the command's line\n"
        "# a comment\n"
        "curl -s a \\\n"
        "     -d b\n"
        '#> {"a": ..., "b": 2}\n'
        "#> second   line\n"
    )
    first, second = commands_of([block])
    assert first == Command("X=1   # a comment on the command's line")
    assert second == Command("curl -s a \\\n     -d b", ['{"a": ..., "b": 2}', "second   line"])
    assert missing_lines(second.expected, 'noise\n{"a": [1, 2], "b": 2}\nmore\nsecond line\n') == []
    assert missing_lines(second.expected, 'second line\n{"a": 1, "b": 2}\n') == ["second   line"]
    assert missing_lines(["a...c"], "abd\n") == ["a...c"]


def test_the_walkthroughs_cover_both_unknown_outcomes() -> None:
    commands = commands_of(walkthroughs())
    texts = "\n".join(command.text for command in commands)
    for needed in ("sleep 6", "Demo-Drop-Response", "reconcile probe", "reconcile resolve"):
        assert needed in texts, needed
    assert sum(len(command.expected) for command in commands) >= 20


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """`make run`'s processes (demo/run_example.py) on free ports, state in tmp_path."""
    port, upstream_port = free_port(), free_port()
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("FENCEPROXY_ADMIN_TOKEN", "FENCEPROXY_CONFIG")
    }
    argv = [sys.executable, "-m", "demo.run_example", "--port", str(port)]
    argv += ["--upstream-port", str(upstream_port), "--state-dir", str(tmp_path / "state")]
    with ManagedProcess(
        "make run", argv, log_path=tmp_path / "make-run.log", env=environment, cwd=ROOT
    ) as run:
        run.wait_http_ok(f"http://127.0.0.1:{port}/_fence/healthz", STARTUP_TIMEOUT_S)
        run.wait_http_ok(f"http://127.0.0.1:{upstream_port}/_demo/healthz", STARTUP_TIMEOUT_S)
        yield port, upstream_port


@pytest.mark.timeout(SCRIPT_TIMEOUT_S + STARTUP_TIMEOUT_S + 30)
def test_the_walkthroughs_print_what_they_show(demo: tuple[int, int], tmp_path: Path) -> None:
    commands = commands_of(walkthroughs())
    script = script_of(commands, *demo)
    environment = {key: value for key, value in os.environ.items() if key != "FENCEPROXY_CONFIG"}
    # No `fenceproxy` on PATH: the walkthrough activates `.venv` where it runs, as a
    # reader's shell at the project's root does.
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    outputs = outputs_of(done.stdout, len(commands))
    failures = [
        f"$ {command.text}\nmissing (in order): {missing}\nprinted:\n{output}"
        for command, output in zip(commands, outputs, strict=True)
        if (missing := missing_lines(command.expected, output))
    ]
    assert not failures, "\n\n".join(failures)
