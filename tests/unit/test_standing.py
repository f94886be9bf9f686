"""A lease's standing: its client is judged by the configuration in force now, not the
one it was granted under. Plain records, an explicit `now`."""

from __future__ import annotations

from dataclasses import replace

from core.fencing import (
    NO_AUTH,
    Admit,
    Clients,
    Replay,
    check_standing,
    decide_admission,
    decide_release,
    decide_renew,
)
from core.records import EffectState, LeaseRecord
from policies import AuthClient, Right
from proxy.auth import ADMIN, Credentials
from tests.unit.test_decisions import NOW, RESOURCE, lease, refused, request, state, stored

SUP = AuthClient(
    name="sup",
    key_env=None,
    key_sha256="ab" * 32,
    resources=("supplier:*",),
    may=frozenset({Right.LEASE}),
)


def clients(*configured: AuthClient) -> Clients:
    return {client.name: client for client in configured}


def sup_lease(**fields: object) -> LeaseRecord:
    return replace(lease(), client="sup", **fields)  # type: ignore[arg-type]


def test_without_auth_every_lease_stands() -> None:
    assert check_standing(sup_lease(), NO_AUTH) is None
    assert check_standing(lease(), NO_AUTH) is None


def test_a_configured_client_in_scope_stands() -> None:
    assert check_standing(sup_lease(), clients(SUP)) is None


def test_a_client_removed_from_auth_is_forbidden() -> None:
    refusal = refused(check_standing(sup_lease(), clients()), "forbidden")
    assert "'sup'" in refusal.detail and "no longer configured" in refusal.detail
    assert refusal.context == {"resource": RESOURCE, "epoch": 3, "client": "sup"}


def test_a_client_narrowed_out_of_its_globs_is_forbidden_resource() -> None:
    narrowed = replace(SUP, resources=("supplier:gadget", "rule:*"))
    refusal = refused(check_standing(sup_lease(), clients(narrowed)), "forbidden_resource")
    assert RESOURCE in refusal.detail


def test_a_client_that_may_no_longer_lease_is_forbidden() -> None:
    reader = replace(SUP, may=frozenset({Right.READ, Right.OPERATE}))
    refusal = refused(check_standing(sup_lease(), clients(reader)), "forbidden")
    # The detail names the client and the setting that took the right away.
    assert refusal.detail == "client 'sup' may no longer lease (auth.clients[].may)"


def test_a_lease_taken_without_auth_is_forbidden_once_auth_is_on() -> None:
    refusal = refused(check_standing(lease(), clients(SUP)), "forbidden")
    assert "without a client key" in refusal.detail


def test_the_admin_stands_while_an_admin_token_is_set() -> None:
    admin_lease = replace(lease(), client=ADMIN.name)
    assert check_standing(admin_lease, clients(SUP, ADMIN)) is None
    refused(check_standing(admin_lease, clients(SUP)), "forbidden")


def test_renew_refuses_a_lease_whose_client_was_removed() -> None:
    current = sup_lease()
    assert decide_renew(current, state(current), NOW, clients(SUP)) is None
    refused(decide_renew(current, state(current), NOW, clients()), "forbidden")


def test_renew_says_stale_before_it_judges_the_client() -> None:
    ended = sup_lease(ended_at=NOW - 1, end_reason="released")
    refused(decide_renew(ended, state(None, epoch=3), NOW, clients()), "stale_epoch")


def test_admission_refuses_a_lease_whose_client_was_removed() -> None:
    current = sup_lease()
    assert decide_admission(request(), current, state(current), None, NOW, clients(SUP)) == Admit()
    decision = decide_admission(request(), current, state(current), None, NOW, clients())
    refused(decision, "forbidden")


def test_admission_refuses_a_client_narrowed_out_of_its_globs() -> None:
    current = sup_lease()
    narrowed = replace(SUP, resources=("rule:*",))
    decision = decide_admission(request(), current, state(current), None, NOW, clients(narrowed))
    refused(decision, "forbidden_resource")


def test_a_client_cut_off_is_not_replayed_its_old_answers() -> None:
    current = sup_lease()
    committed = stored(EffectState.COMMITTED)
    kept = decide_admission(request(), current, state(current), committed, NOW, clients(SUP))
    assert isinstance(kept, Replay)
    cut_off = decide_admission(request(), current, state(current), committed, NOW, clients())
    refused(cut_off, "forbidden")


def test_release_never_judges_the_client() -> None:
    # It takes no configuration at all: letting go is always safe.
    current = sup_lease()
    assert decide_release(current, state(current), NOW) is None


def test_credentials_name_the_clients_whose_leases_stand() -> None:
    without_auth = Credentials(keys=((b"d" * 32, ADMIN),), required=False)
    assert without_auth.standing is None
    cert_only = replace(SUP, name="cert", key_sha256=None, cert_subject="worker.example")
    with_auth = Credentials(
        keys=((b"d" * 32, ADMIN), (b"e" * 32, SUP)),
        required=True,
        subjects={"worker.example": cert_only},
    )
    assert with_auth.standing == {"admin": ADMIN, "sup": SUP, "cert": cert_only}
