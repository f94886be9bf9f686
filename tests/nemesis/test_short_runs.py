"""The nemesis in `make test`: a few fixed seeds, short, on PostgreSQL (two replicas on
one database behind the relay; a primary with its synchronous standby, failed over
mid-run; a Patroni cluster with etcd in synchronous mode, switched over mid-run) and
on SQLite (one replica). A violation fails the test with the seed, the schedule, the
history and the upstream's records; `python -m tests.nemesis --seed N --seeds 1
--run-s S --backend B` runs the seed again. `make chaos` runs seeds for longer."""

from __future__ import annotations

import pytest

from tests import pg
from tests.nemesis.harness import Report, run_seed
from tests.nemesis.patroni import require_patroni
from tests.pgstandby import require_postgres_bin

pytestmark = pytest.mark.timeout(180)

RUN_S = 10.0


def check(report: Report) -> None:
    print(report.text())
    assert report.history.faults, "the schedule injected no fault"
    assert report.applied > 0, report.text()
    assert report.violations == [], report.text()
    # Liveness, loosely: once the faults end, every key gets an answer that says applied.
    assert report.unresolved == {}, report.text()


async def test_seeded_faults_on_postgres_break_no_promise() -> None:
    report = await run_seed(11, RUN_S, "postgres", admin_url=pg.require_admin_url())
    check(report)


async def test_seeded_faults_on_sqlite_break_no_promise() -> None:
    check(await run_seed(13, 6.0, "sqlite"))


async def test_seeded_faults_with_a_failover_to_a_synchronous_standby() -> None:
    require_postgres_bin()
    report = await run_seed(13, RUN_S, "standby")
    assert report.history.faults["failover"] == 1, report.text()
    check(report)


async def test_seeded_faults_with_a_patroni_switchover_in_synchronous_mode() -> None:
    require_patroni()
    report = await run_seed(7, RUN_S, "patroni-sync")
    assert report.history.faults["leader"] == 1, report.text()
    check(report)
