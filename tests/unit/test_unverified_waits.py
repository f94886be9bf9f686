"""Which requests carry a verified credential before their body (proxy/requests.py
`CREDENTIAL_VERIFIED`): only those the connection guard keeps while they wait."""

from __future__ import annotations

import hashlib
import time
from typing import cast

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from core.records import LeaseRecord, Refusal
from policies import AuthClient, Right
from proxy.auth import KEYRING, Credentials, Keyring
from proxy.control import verify_presented_key
from proxy.requests import CREDENTIAL_VERIFIED, lease_before_body
from store import Store

KEY = "worker-key"
WORKERS = AuthClient(
    name="workers",
    key_env=None,
    key_sha256=hashlib.sha256(KEY.encode()).hexdigest(),
    resources=("*",),
    may=frozenset({Right.LEASE}),
)
TOKEN = "fpt_" + "A" * 43


def renew_request(*headers: tuple[str, str]) -> web.Request:
    app = web.Application()
    app[KEYRING] = Keyring(Credentials(((hashlib.sha256(KEY.encode()).digest(), WORKERS),), True))
    return make_mocked_request(
        "POST", "/_fence/v1/leases/renew", headers=CIMultiDict(headers), app=app
    )


def test_a_renew_presenting_a_configured_clients_key_is_verified_before_its_lookup() -> None:
    request = renew_request(("Fence-Token", TOKEN), ("Authorization", f"Bearer {KEY}"))
    verify_presented_key(request)
    assert request.get(CREDENTIAL_VERIFIED) is True


@pytest.mark.parametrize(
    "headers",
    [
        (),
        (("Authorization", "Bearer not-a-key"),),
        # Two copies are ambiguous: no credential, and no refusal either (none is needed).
        (("Authorization", f"Bearer {KEY}"), ("Authorization", f"Bearer {KEY}")),
    ],
)
def test_a_renew_without_a_valid_key_waits_for_its_token(
    headers: tuple[tuple[str, str], ...],
) -> None:
    request = renew_request(("Fence-Token", TOKEN), *headers)
    verify_presented_key(request)
    assert request.get(CREDENTIAL_VERIFIED) is None


class OneLease:
    def __init__(self, lease: LeaseRecord | None) -> None:
        self.lease = lease

    async def lease_of_token(self, token_hash: str) -> LeaseRecord | None:
        return self.lease


def lease(expires_in_s: float, ended: bool = False) -> LeaseRecord:
    now = time.time()
    return LeaseRecord(
        "supplier:widget",
        1,
        "worker",
        now - 1,
        now + expires_in_s,
        now if ended else None,
        "released" if ended else None,
    )


@pytest.mark.parametrize(
    ("expires_in_s", "ended", "verified"),
    [(30, False, True), (30, True, None), (-1, False, None)],
)
async def test_only_a_live_leases_token_is_a_credential(
    expires_in_s: float, ended: bool, verified: bool | None
) -> None:
    # Made as the test runs, not as it is collected: a suite that takes longer than the
    # lease to reach this test would find it expired.
    found = lease(expires_in_s, ended)
    request = renew_request(("Fence-Token", TOKEN))
    assert await lease_before_body(request, TOKEN, cast(Store, OneLease(found))) == found
    assert request.get(CREDENTIAL_VERIFIED) is verified


async def test_a_token_never_issued_is_refused_before_the_body() -> None:
    request = renew_request(("Fence-Token", TOKEN))
    with pytest.raises(Refusal) as refused:
        await lease_before_body(request, TOKEN, cast(Store, OneLease(None)))
    assert refused.value.code == "invalid_token"
