"""Scope confusion through delimiters.

Route `/tenants/{t}/orders/{id}`, resource `tenant:{t}:order:{id}`, a client scoped
to `tenant:acme:*`. The path t=`acme:evil` used to render `tenant:acme:evil:order:1`,
inside the client's glob, and went upstream as tenant `acme:evil`'s order. A value
holding a separator of its template is refused at routing, before anything.
"""

from __future__ import annotations

import pytest

from tests.integration.app.conftest import Fence, FenceFactory, assert_problem
from tests.integration.app.test_auth import _sha256, bearer, granted

ACME_KEY = "acme-key-0123456789abcdef0123456789ab"

# Appended after the test policy's routes (its last block): one more route, then auth.
TENANT_ROUTE_AND_AUTH = f"""\
  - name: tenant-order
    upstream: supplier
    match: {{methods: [POST], path: "/tenants/{{t}}/orders/{{id}}"}}
    resource: "tenant:{{t}}:order:{{id}}"
    fence: required
auth:
  clients:
    - name: acme-workers
      key_sha256: "{_sha256(ACME_KEY)}"
      resources: ["tenant:acme:*"]
      may: [lease]
"""


@pytest.fixture
async def tenants(make_fence: FenceFactory) -> Fence:
    return await make_fence(top_level=TENANT_ROUTE_AND_AUTH)


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        ("/tenants/acme:evil/orders/1", "t"),
        ("/tenants/acme%3Aevil/orders/1", "t"),  # matched against the decoded path
        ("/tenants/acme/orders/evil:1", "id"),
    ],
    ids=["tenant", "tenant-encoded", "id"],
)
async def test_a_value_holding_the_templates_separator_is_refused_at_routing(
    tenants: Fence, path: str, parameter: str
) -> None:
    # The resource the old rendering gave is in the client's glob: it can lease it.
    lease = await granted(tenants, "tenant:acme:evil:order:1", ACME_KEY)
    response = await tenants.client.post(
        path, json={"qty": 1}, headers={"Fence-Token": lease["token"], **bearer(ACME_KEY)}
    )
    problem = await assert_problem(response, 400, "invalid_request")
    assert problem["parameter"] == parameter
    assert f"{{{parameter}}} may not contain ':'" in problem["detail"]
    assert await tenants.effects() == []  # nothing admitted, so nothing forwarded


async def test_a_value_without_separators_is_forwarded(tenants: Fence) -> None:
    lease = await granted(tenants, "tenant:acme:order:1", ACME_KEY)
    response = await tenants.client.post(
        "/tenants/acme/orders/1", json={"qty": 1}, headers={"Fence-Token": lease["token"]}
    )
    # The demo upstream has no such route: its 404, forwarded, settles NOT_COMMITTED.
    assert response.status == 404, await response.text()
    (effect,) = await tenants.effects()
    assert (effect["resource"], effect["state"]) == ("tenant:acme:order:1", "NOT_COMMITTED")
