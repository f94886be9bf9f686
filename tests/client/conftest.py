"""The client against real processes: the demo upstream and `fenceproxy serve` on free
ports (tests/integration/processes starts and always stops them), with a reconcile
block on place-order so that an unknown outcome is settled by the proxy's own probe."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
