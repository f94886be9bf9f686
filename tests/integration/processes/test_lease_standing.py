"""A lease's standing, end to end: a client removed from `auth:` loses its leases.

Real processes: client `sup` takes a lease and writes through `fenceproxy serve`; the
proxy is stopped and started again with a configuration without `sup`. The old token
can no longer renew or write (nothing reaches the demo upstream, which counts its own
orders), and can still release.
"""

from __future__ import annotations

import secrets

import pytest

from tests.integration.processes.conftest import HttpResult, Stack, assert_refused, http_call

SUP_KEY_ENV = "FENCEPROXY_KEY_SUP"
SUP_KEY = secrets.token_urlsafe(32)
OTHERS_KEY_ENV = "FENCEPROXY_KEY_OTHERS"

SUP = f"""\
    - name: sup
      key_env: {SUP_KEY_ENV}
      resources: ["supplier:*"]
      may: [lease]
"""
OTHERS = f"""\
    - name: others
      key_env: {OTHERS_KEY_ENV}
      resources: ["*"]
      may: [lease]
"""
WITH_SUP = "auth:\n  clients:\n" + SUP + OTHERS


def renew(stack: Stack, token: str) -> HttpResult:
    return http_call(
        stack.proxy_url,
        "POST",
        "/_fence/v1/leases/renew",
        json_body={"ttl_s": 30},
        headers={"Fence-Token": token},
    )


@pytest.mark.fence_stack(
    top_level=WITH_SUP,
    env=((SUP_KEY_ENV, SUP_KEY), (OTHERS_KEY_ENV, secrets.token_urlsafe(32))),
)
def test_a_restart_without_client_sup_cuts_its_token_off(stack: Stack) -> None:
    granted = http_call(
        stack.proxy_url,
        "POST",
        "/_fence/v1/leases",
        json_body={"resource": "supplier:widget", "holder": "sup-worker", "ttl_s": 30},
        headers={"Authorization": f"Bearer {SUP_KEY}"},
    )
    assert granted.status == 201, granted
    token = granted.body["token"]
    renewed = renew(stack, token)
    assert renewed.status == 200, renewed
    assert stack.place_order("widget", token, "order-1").status == 201
    assert stack.upstream_orders() == 1

    stack.sigterm_proxy()
    assert stack.wait_proxy_exit(15.0) == 0
    assert stack.config_path is not None
    config = stack.config_path.read_text(encoding="utf-8")
    assert SUP in config
    stack.config_path.write_text(config.replace(SUP, ""), encoding="utf-8")
    stack.restart_proxy()

    problem = assert_refused(renew(stack, token), 403, "forbidden")
    assert problem["client"] == "sup"
    assert_refused(stack.place_order("widget", token, "order-2"), 403, "forbidden")
    # The same key again (a retry): not replayed to a client cut off either.
    assert_refused(stack.place_order("widget", token, "order-1"), 403, "forbidden")
    assert stack.upstream_orders() == 1
    released = stack.release(token)
    assert released.status == 200, released
