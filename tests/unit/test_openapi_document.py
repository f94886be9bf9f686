"""What the OpenAPI document says of the rules that depend on the caller."""

from __future__ import annotations

from proxy import openapi


def test_resolve_says_operator_is_required_with_the_admin_token_only() -> None:
    """JSON Schema cannot make a field depend on the credential: the body leaves
    `operator` optional (a client's key names its decision itself) and says, where a
    reader of the body looks, that the admin token needs it (400 without)."""
    operation = openapi.document()["paths"]["/_fence/v1/effects/{effect_id}/resolve"]["post"]
    body = operation["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert schema["required"] == ["outcome", "reason"]
    assert "`operator` is required with the admin token" in body["description"]
    assert "400" in operation["responses"]
