"""The nemesis's judge and schedule, on hand-made records: each rule catches what it is
for (and a truthful history passes), so a rule taken out fails here."""

from __future__ import annotations

from tests.integration.replicas.conftest import Answer
from tests.nemesis.harness import classify
from tests.nemesis.judge import Applied, Arrival, Attempt, Grant, Told, Violation, judge
from tests.nemesis.schedule import QUIET_END_S, FaultKind, make_schedule


def grant(worker: str, epoch: int, target: str = "n0") -> Grant:
    return Grant(worker, f"r:{target}", epoch, "r0", 0.0)


def attempt(
    key: str,
    epoch: int,
    told: Told,
    *,
    code: str | None = None,
    effect_id: str | None = None,
    answer_epoch: str | None = None,
) -> Attempt:
    status = 201 if told is Told.APPLIED else 409
    worker = key.rsplit("-", 1)[0]
    return Attempt(worker, key, "n0", epoch, "r0", told, status, code, effect_id, answer_epoch, 0.0)


def applied(seq: int, key: str, epoch: int, target: str = "n0") -> Applied:
    return Applied(seq, target, key, str(epoch))


def rules(violations: list[Violation]) -> list[str]:
    return [violation.rule for violation in violations]


def test_a_truthful_history_passes() -> None:
    grants = [grant("w0", 1), grant("w1", 2)]
    attempts = [
        attempt("w0-0", 1, Told.UNKNOWN),
        attempt("w0-0", 1, Told.APPLIED, answer_epoch="1"),
        attempt("w0-1", 1, Told.NOT_SENT, code="stale_epoch"),
        attempt("w1-0", 2, Told.APPLIED, answer_epoch="2"),
    ]
    records = [applied(1, "w0-0", 1), applied(2, "w1-0", 2)]
    arrivals = [Arrival("e1", "w0-0", "1"), Arrival("e2", "w1-0", "2")]
    assert judge(records, arrivals, grants, attempts) == []


def test_a_key_applied_twice() -> None:
    grants = [grant("w0", 1)]
    attempts = [attempt("w0-0", 1, Told.UNKNOWN)]
    records = [applied(1, "w0-0", 1), applied(2, "w0-0", 1)]
    assert rules(judge(records, [], grants, attempts)) == ["key applied twice"]


def test_an_epoch_written_after_a_higher_one() -> None:
    grants = [grant("w0", 1), grant("w1", 2)]
    attempts = [attempt("w1-0", 2, Told.UNKNOWN), attempt("w0-0", 1, Told.UNKNOWN)]
    records = [applied(1, "w1-0", 2), applied(2, "w0-0", 1)]
    assert rules(judge(records, [], grants, attempts)) == ["stale write"]


def test_one_epoch_granted_to_two_holders_and_written_by_both() -> None:
    grants = [grant("w0", 1), grant("w1", 1)]
    attempts = [attempt("w0-0", 1, Told.UNKNOWN), attempt("w1-0", 1, Told.UNKNOWN)]
    records = [applied(1, "w0-0", 1), applied(2, "w1-0", 1)]
    assert rules(judge(records, [], grants, attempts)) == [
        "epoch granted twice",
        "epoch written by two holders",
    ]


def test_a_write_under_an_epoch_its_worker_was_not_granted() -> None:
    grants = [grant("w0", 1)]
    records = [applied(1, "w1-0", 1)]
    assert rules(judge(records, [], grants, [])) == [
        "write under an epoch its worker was never granted"
    ]


def test_told_applied_and_the_upstream_has_nothing() -> None:
    grants = [grant("w0", 1)]
    attempts = [attempt("w0-0", 1, Told.APPLIED)]
    assert rules(judge([], [], grants, attempts)) == ["applied, says the answer"]


def test_told_applied_at_another_epoch_than_the_upstream_has() -> None:
    grants = [grant("w0", 1)]
    attempts = [attempt("w0-0", 1, Told.APPLIED, answer_epoch="7")]
    records = [applied(1, "w0-0", 1)]
    assert rules(judge(records, [], grants, attempts)) == ["applied, says the answer"]


def test_told_nothing_was_sent_for_an_effect_that_arrived() -> None:
    grants = [grant("w0", 1)]
    attempts = [
        attempt("w0-0", 1, Told.NOT_SENT, code="upstream_unreachable", effect_id="e1"),
        attempt("w0-0", 1, Told.UNKNOWN),
    ]
    records = [applied(1, "w0-0", 1)]
    arrivals = [Arrival("e1", "w0-0", "1")]
    assert rules(judge(records, arrivals, grants, attempts)) == [
        "upstream_unreachable, says the answer"
    ]


def test_a_refusal_naming_another_effect_claims_nothing_of_it() -> None:
    grants = [grant("w0", 1)]
    attempts = [
        attempt("w0-0", 1, Told.UNKNOWN),
        attempt("w0-0", 1, Told.NOT_SENT, code="request_in_progress", effect_id="e1"),
    ]
    records = [applied(1, "w0-0", 1)]
    arrivals = [Arrival("e1", "w0-0", "1")]
    assert judge(records, arrivals, grants, attempts) == []


def test_told_not_applied_for_an_effect_the_upstream_applied() -> None:
    grants = [grant("w0", 1)]
    attempts = [attempt("w0-0", 1, Told.NOT_APPLIED, code="effect_settled", effect_id="e1")]
    records = [applied(1, "w0-0", 1)]
    arrivals = [Arrival("e1", "w0-0", "1")]
    assert rules(judge(records, arrivals, grants, attempts)) == ["not applied, say all the answers"]
    # Its headers reached the upstream, its body did not: nothing was applied.
    assert judge([], arrivals, grants, attempts) == []


def test_every_attempt_refused_and_yet_applied_at_that_epoch() -> None:
    grants = [grant("w0", 1)]
    attempts = [attempt("w0-0", 1, Told.NOT_SENT, code="resource_blocked")]
    records = [applied(1, "w0-0", 1)]
    assert rules(judge(records, [], grants, attempts)) == ["not applied, say all the answers"]


def test_answers_are_classified_by_what_they_claim() -> None:
    def answer(status: int, code: str | None = None, effect_id: str | None = None) -> Answer:
        body = {"code": code, "effect_id": effect_id} if code else {}
        return Answer(status, body, {})

    assert classify(None) is Told.UNKNOWN
    assert classify(answer(201)) is Told.APPLIED
    assert classify(answer(409, "stale_epoch")) is Told.NOT_SENT
    assert classify(answer(504, "outcome_unknown", "e1")) is Told.UNKNOWN
    assert classify(answer(409, "effect_settled", "e1")) is Told.NOT_APPLIED
    # Also the answer to a request that was sent, and answered against a settled state.
    assert classify(answer(409, "conflicting_evidence", "e1")) is Told.UNKNOWN
    # A store that failed before dispatch did nothing; after it, the effect is in doubt.
    assert classify(answer(503, "store_unavailable")) is Told.NOT_SENT
    assert classify(answer(503, "store_unavailable", "e1")) is Told.UNKNOWN


def test_a_seed_decides_the_schedule() -> None:
    first = make_schedule(5, 30.0, faults=frozenset(FaultKind))
    assert first == make_schedule(5, 30.0, faults=frozenset(FaultKind))
    assert first != make_schedule(6, 30.0, faults=frozenset(FaultKind))
    assert [fault.kind for fault in first.faults].count(FaultKind.FAILOVER) == 1
    # Every fault starts before the quiet end of the run (the harness ends any still on
    # at the deadline, before the workers settle).
    assert all(fault.at_s < 30.0 - QUIET_END_S for fault in first.faults)
