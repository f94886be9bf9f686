"""Child processes for the tools that run fenceproxy from outside.

`make run` (demo/run_example.py), the benchmark (bench/) and the process and
replica test suites (tests/integration/) all start real processes, wait until
they answer and stop them. A `ManagedProcess` starts at construction, sends its
output to a log file (so a failure can show what the child said) and is always
stopped when used as a context manager; `free_port` finds a port to give it.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

POLL_INTERVAL_S = 0.05
DEFAULT_TAIL_LINES = 40

# Ignore any http_proxy/https_proxy in the environment: readiness checks must
# reach the local child directly, never a corporate proxy.
_direct_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# The ports `free_port` handed out lately. A port is free again once its socket here is
# closed, and the kernel may hand the same one out for the next call, before the child
# given the first has bound it (a fleet writes every replica's config, then starts them
# all): two children would then race for one port, and one would fail to start.
_HANDED_OUT: deque[int] = deque(maxlen=4096)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago, and not one this process
    handed out lately (whose child may not have bound it yet)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


class ProcessFailed(RuntimeError):
    """A managed child exited early or never became ready; the message has its log tail."""


class ManagedProcess:
    """A child process with its stdout and stderr in one log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: str | Path,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        start_new_session: bool = False,
    ) -> None:
        """Start `argv` now.

        `env` replaces the inherited environment, as with `subprocess.Popen`;
        None inherits it. `start_new_session` keeps the terminal's Ctrl-C away
        from the child, for a parent that stops its children itself: a child
        hit by both Ctrl-C and the parent's SIGTERM can abort its own shutdown.
        """
        self.name = name
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Python children block-buffer stdout when it is a file; unbuffered
        # output keeps the log tail complete even after SIGKILL.
        child_env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
        self._log_file: IO[bytes] = self.log_path.open("wb")
        try:
            self._popen = subprocess.Popen(
                list(argv),
                env=child_env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=start_new_session,
            )
        except BaseException:
            self._log_file.close()
            raise

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the child has exited (negative: killed by that signal)."""
        return self._popen.poll()

    def is_running(self) -> bool:
        return self._popen.poll() is None

    def wait_http_ok(
        self, url: str, timeout_s: float = 15.0, tls: ssl.SSLContext | None = None
    ) -> None:
        """Poll `url` until it answers 2xx; raise ProcessFailed if the child dies or time is up.
        `tls`: the client context for an https `url` (the CAs to trust, a client certificate)."""
        opener = _direct_opener
        if tls is not None:
            opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls)
            )
        deadline = time.monotonic() + timeout_s
        last_problem = "no attempt made"
        while True:
            if not self.is_running():
                raise self.failure(f"exited with status {self.returncode} before {url} was ready")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self.failure(f"{url} not ready after {timeout_s:g} s ({last_problem})")
            try:
                with opener.open(url, timeout=min(1.0, remaining)) as response:
                    status: int = response.status
                if 200 <= status < 300:
                    return
                last_problem = f"status {status}"
            except OSError as exc:  # refused, reset, timed out, or a non-2xx HTTPError
                last_problem = f"{type(exc).__name__}: {exc}"
            time.sleep(POLL_INTERVAL_S)

    def pause(self) -> None:
        """Freeze the child (SIGSTOP): it keeps its sockets but answers nothing."""
        self._popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._popen.send_signal(signal.SIGCONT)

    def is_stopped(self) -> bool:
        """Whether the child is stopped by a signal (state `T` in /proc/PID/stat), e.g.
        by itself at a failpoint (core/failpoints.py)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        # The state follows the command name, which is in parentheses and may hold any.
        return stat[stat.rindex(")") + 2 :].startswith("T")

    def wait_stopped(self, timeout_s: float = 15.0) -> None:
        """Poll until the child has stopped itself; raise ProcessFailed if it dies or
        time is up."""
        deadline = time.monotonic() + timeout_s
        while not self.is_stopped():
            if not self.is_running():
                raise self.failure(f"exited with status {self.returncode} before it stopped")
            if time.monotonic() > deadline:
                raise self.failure(f"not stopped after {timeout_s:g} s")
            time.sleep(POLL_INTERVAL_S)

    def kill(self) -> None:
        """SIGKILL: the child gets no chance to clean up, like a crash."""
        if self.is_running():
            self._popen.kill()
        self._popen.wait()
        self._log_file.close()

    def terminate(self, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if the child is still alive after `grace_s`."""
        if self.is_running():
            self._popen.terminate()
            # A paused child would hold SIGTERM pending until continued, so
            # shutting down a paused child would always cost the full grace.
            self._popen.send_signal(signal.SIGCONT)
            try:
                self._popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._popen.kill()
        self._popen.wait()
        self._log_file.close()

    def log_tail(self, lines: int = DEFAULT_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> ProcessFailed:
        """An error saying what went wrong with this child, with its log tail."""
        return ProcessFailed(
            f"{self.name} (pid {self.pid}) {what}; last lines of {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.terminate()
