"""The nemesis in `make test`: a few fixed seeds, short, on PostgreSQL (two replicas on
one database; and a primary with its synchronous standby, failed over mid-run) and on
SQLite (one replica). A violation fails the test with the seed, the schedule and the
history (`python -m tests.nemesis --seed N --seeds 1 --run-s S --backend B` replays it).
`make chaos` runs the same for longer."""

from __future__ import annotations

import pytest

from tests import pg
from tests.nemesis.harness import run_seed
from tests.pgstandby import require_postgres_bin

pytestmark = pytest.mark.timeout(150)

RUN_S = 12.0


def check(report_text: str, violations: int, unresolved: int) -> None:
    print(report_text)
    assert violations == 0, report_text
    # Liveness, loosely: once the faults end, the workers get their keys answered.
    assert unresolved == 0, report_text


async def test_seeded_faults_on_postgres_break_no_promise() -> None:
    admin = pg.require_admin_url()
    report = await run_seed(11, RUN_S, "postgres", admin_url=admin)
    assert report.history.faults, "the schedule injected no fault"
    assert report.applied > 0, report.text()
    check(report.text(), len(report.violations), len(report.unresolved))


async def test_seeded_faults_on_sqlite_break_no_promise() -> None:
    report = await run_seed(12, 8.0, "sqlite")
    assert report.history.faults, "the schedule injected no fault"
    check(report.text(), len(report.violations), len(report.unresolved))


async def test_seeded_faults_with_a_failover_to_a_synchronous_standby() -> None:
    require_postgres_bin()
    report = await run_seed(13, RUN_S, "standby")
    assert report.history.faults["failover"] == 1, report.text()
    check(report.text(), len(report.violations), len(report.unresolved))
