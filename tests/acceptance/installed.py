"""What the wheel's and the image's tests ask of a proxy installed outside the checkout."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def fenced_order_goes_through(base_url: str, idempotency_key: str) -> None:
    """A lease on supplier:widget, then a fenced order under it: both answered 201, and
    the order is the upstream's."""
    lease = _post(f"{base_url}/_fence/v1/leases", {"resource": "supplier:widget", "holder": "w"})
    order = _post(
        f"{base_url}/orders/widget",
        {"qty": 1},
        {"Fence-Token": lease["token"], "Idempotency-Key": idempotency_key},
    )
    assert order["sku"] == "widget", order


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 201, answer.status
        return json.loads(answer.read())
