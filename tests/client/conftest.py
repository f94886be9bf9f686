"""The client against real processes: the demo upstream and `fenceproxy serve` on free
ports (tests/integration/processes starts and always stops them), with a reconcile
block on place-order so that an unknown outcome is settled by the proxy's own probe."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.processes import free_port
from tests.integration.processes.conftest import (
    ReconcileBlock,
    Stack,
    StackOptions,
    _start_stack,
)

# A write held SLOW_WRITE_MS by the upstream outlives the proxy's upstream timeout
# (0.5 s): its outcome is unknown, the probes before SETTLE_S find nothing yet and are
# inconclusive, the probe at SETTLE_S finds it committed. So the effect stays in doubt,
# and its resource blocked, for over a second.
SLOW_WRITE_MS = 1000
SETTLE_S = 3.0


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    yield from _start_stack(
        tmp_path, StackOptions(reconcile=ReconcileBlock(settle_s=SETTLE_S, attempts=10))
    )


# Every variable by which httpx would route a call through a proxy, or exempt it.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
NO_PROXY_VARIABLES = ("NO_PROXY", "no_proxy")


@pytest.fixture
def unreachable_http_proxy(monkeypatch: pytest.MonkeyPatch) -> str:
    """The environment names an HTTP proxy at a port nothing listens on: a client that
    honours it cannot reach the sidecar (and would hand it the lease's token)."""
    proxy = f"http://127.0.0.1:{free_port()}"
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, proxy)
        monkeypatch.setenv(name.lower(), proxy)
    for name in NO_PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return proxy
