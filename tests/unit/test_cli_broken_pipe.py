"""A reader that goes away (`fenceproxy effects show ID | grep -q ...`, `| head`) ends the
command quietly, with the status a shell gives a process killed by SIGPIPE: no traceback
and no "Exception ignored" on stderr, whichever command wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import BROKEN_PIPE_EXIT

# The installed console script, as a user runs it.
FENCEPROXY = str(Path(sys.executable).with_name("fenceproxy"))


def run_into_closed_pipe(args: list[str], *, buffered: bool) -> subprocess.CompletedProcess[str]:
    # The read end is closed before the command starts: its first write (or the flush
    # at its end) meets EPIPE every time, with no race against the reader.
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    try:
        return subprocess.run(
            [FENCEPROXY, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            check=False,
            timeout=60,
        )
    finally:
        os.close(write_end)


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "fenceproxy.yaml"
    path.write_text(
        "version: 1\n"
        f"store: sqlite:///{tmp_path}/fenceproxy.db\n"
        "upstreams: {api: {url: 'http://127.0.0.1:9'}}\n"
        "routes:\n"
        "  - {name: put, upstream: api, match: {methods: [PUT], path: '/x/{id}'},"
        " resource: 'x-{id}', fence: required}\n",
        encoding="utf-8",
    )
    migrated = subprocess.run(
        [FENCEPROXY, "store", "migrate", "--config", str(path)],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert migrated.returncode == 0, migrated.stderr
    return path


@pytest.mark.parametrize("buffered", [True, False])
def test_a_closed_pipe_ends_a_store_command_quietly(policy: Path, buffered: bool) -> None:
    ended = run_into_closed_pipe(["effects", "list", "--config", str(policy)], buffered=buffered)
    assert (ended.returncode, ended.stderr) == (BROKEN_PIPE_EXIT, "")


def test_a_closed_pipe_ends_check_config_quietly(policy: Path) -> None:
    ended = run_into_closed_pipe(["check-config", str(policy)], buffered=True)
    assert (ended.returncode, ended.stderr) == (BROKEN_PIPE_EXIT, "")
