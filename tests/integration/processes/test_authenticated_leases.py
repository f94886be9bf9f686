"""Clients and rights, end to end: with an `auth:` block, a process without a client's key
cannot take a worker's resource, and the worker with its key can and writes through.

Real processes: `fenceproxy serve` (key from its environment) in front of the demo
upstream, which counts its own orders.
"""

from __future__ import annotations

import secrets

import pytest

from tests.integration.processes.conftest import Stack, assert_refused, http_call

WORKER_KEY_ENV = "FENCEPROXY_KEY_SUPPLIER"
WORKER_KEY = secrets.token_urlsafe(32)
VICTIM = "supplier:victim"

AUTH = f"""\
auth:
  clients:
    - name: supplier-workers
      key_env: {WORKER_KEY_ENV}
      resources: ["supplier:*"]
      may: [lease]
"""


def _acquire(stack: Stack, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    result = http_call(
        stack.proxy_url,
        "POST",
        "/_fence/v1/leases",
        json_body={"resource": VICTIM, "holder": "rogue-or-worker", "ttl_s": 30},
        headers=headers,
    )
    return result.status, result.body


def _view(stack: Stack) -> dict[str, object]:
    result = http_call(
        stack.proxy_url,
        "GET",
        f"/_fence/v1/leases?resource={VICTIM}",
        headers=stack.admin_headers(),
    )
    assert result.status == 200, result
    view: dict[str, object] = result.body
    return view


@pytest.mark.fence_stack(top_level=AUTH, env=((WORKER_KEY_ENV, WORKER_KEY),))
def test_a_rogue_without_a_key_cannot_take_the_workers_resource(stack: Stack) -> None:
    for rogue in ({}, {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}):
        result = http_call(
            stack.proxy_url,
            "POST",
            "/_fence/v1/leases",
            json_body={"resource": VICTIM, "holder": "rogue", "ttl_s": 60},
            headers=rogue,
        )
        assert_refused(result, 401, "unauthorized")
    assert (_view(stack)["epoch"], _view(stack)["holder"]) == (0, None)
    # Holder names are not for anyone to read either.
    peek = http_call(stack.proxy_url, "GET", f"/_fence/v1/leases?resource={VICTIM}")
    assert_refused(peek, 401, "unauthorized")
    assert_refused(http_call(stack.proxy_url, "GET", "/_fence/metrics"), 401, "unauthorized")

    status, lease = _acquire(stack, {"Authorization": f"Bearer {WORKER_KEY}"})
    assert status == 201, lease
    assert (lease["epoch"], lease["client"]) == (1, "supplier-workers")
    view = _view(stack)
    assert (view["holder"], view["client"], view["live"]) == (
        "rogue-or-worker",
        "supplier-workers",
        True,
    )
    token = lease["token"]
    assert isinstance(token, str)
    order = stack.place_order("victim", token, "order-1")
    assert order.status == 201, order
    assert stack.upstream_orders() == 1
    # The rogue is still refused while the worker holds it, before any lease check.
    assert_refused(
        http_call(
            stack.proxy_url,
            "POST",
            "/_fence/v1/leases",
            json_body={"resource": VICTIM, "holder": "rogue"},
        ),
        401,
        "unauthorized",
    )
    assert "warning" not in stack.proxy.log_path.read_text(encoding="utf-8")
