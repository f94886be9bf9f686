"""The nemesis in `make test`: a few fixed seeds, short, on PostgreSQL (two replicas on one
database behind the relay, and again with a replica cut off past its stop grace; a
primary with its synchronous standby, failed over mid-run; a Patroni cluster with etcd
in synchronous mode, switched over mid-run) and on SQLite (one replica). Each seed is
chosen for the faults its schedule draws (the comment above each test says which); a
schedule change that loses them means choosing the seed again. A violation fails the
test with the seed, the schedule, the history and the upstream's records; `python -m
tests.nemesis --seed N --seeds 1 --run-s S --backend B` runs the seed again. `make
chaos` runs seeds for longer."""

from __future__ import annotations

import pytest

from tests import pg
from tests.nemesis.harness import Report, run_seed
from tests.nemesis.patroni import require_patroni
from tests.pgstandby import require_postgres_bin

pytestmark = pytest.mark.timeout(180)

RUN_S = 10.0
CUT_OFF_RUN_S = 12.0


def check(report: Report) -> None:
    print(report.text())
    assert report.history.faults, "the schedule injected no fault"
    assert report.applied > 0, report.text()
    assert report.violations == [], report.text()
    # Liveness, loosely: once the faults end, every key gets an answer that says applied.
    assert report.unresolved == {}, report.text()


# A pause, a renewal's COMMIT held then cut by the relay, a replica stopped at `admitted`.
async def test_seeded_faults_on_postgres_break_no_promise() -> None:
    report = await run_seed(77, RUN_S, "postgres", admin_url=pg.require_admin_url())
    check(report)


# A replica killed, every database connection cut, then a replica's handler cancelled
# mid-dispatch and the replica held there for 3.2 s. A longer run: on a loaded machine
# the restarts (of the killed replica, then of the one to cut off) and the wait for a
# write to make slow take seconds, and the cut-off must happen before the deadline.
async def test_a_replica_cut_off_past_its_stop_grace_breaks_no_promise() -> None:
    report = await run_seed(3277, CUT_OFF_RUN_S, "postgres", admin_url=pg.require_admin_url())
    assert report.history.stops["cancelled"] == 1, report.text()
    check(report)


# The one replica stopped at `admitted` for 4.9 s.
async def test_seeded_faults_on_sqlite_break_no_promise() -> None:
    check(await run_seed(7, 6.0, "sqlite"))


# A replica stopped at `before_send` for 5.9 s, the primary failed over meanwhile.
async def test_seeded_faults_with_a_failover_to_a_synchronous_standby() -> None:
    require_postgres_bin()
    report = await run_seed(2, RUN_S, "standby")
    assert report.history.faults["failover"] == 1, report.text()
    check(report)


# A pause, then a switchover.
async def test_seeded_faults_with_a_patroni_switchover_in_synchronous_mode() -> None:
    require_patroni()
    report = await run_seed(230, RUN_S, "patroni-sync")
    assert report.history.faults["leader"] == 1, report.text()
    check(report)
