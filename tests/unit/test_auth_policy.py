"""The policy's `auth:` block, `admin_token_next_env` and `metrics_listen`: parsed into
clients with rights and scopes, every problem named by line and key."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from policies import Auth, AuthClient, Listen, Right, parse_policy
from proxy.auth import (
    ADMIN,
    Credentials,
    KeyProblem,
    blank_admin_token_warnings,
    env_secret,
    exposure_warning,
    is_loopback,
    missing_keys,
)
from tests.unit.test_policies import VALID, assert_single_problem, edit, problems_of, with_text

DIGEST = "ab" * 32


def with_clients(*clients: str) -> str:
    """VALID with an auth block: line 13 is `auth:`, 14 `clients:`, each client from 15."""
    return with_text("auth:", "  clients:", *(f"    - {client}" for client in clients))


GOOD = f'{{name: ops, key_sha256: "{DIGEST}", resources: ["supplier:*"], may: [read]}}'


def client(**fields: object) -> AuthClient:
    defaults: dict[str, object] = {
        "name": "c",
        "key_env": None,
        "key_sha256": DIGEST,
        "resources": ("*",),
        "may": frozenset({Right.READ}),
    }
    return AuthClient(**{**defaults, **fields})  # type: ignore[arg-type]


def test_a_client_is_parsed_with_its_key_scope_and_rights() -> None:
    policy = parse_policy(
        with_clients(
            GOOD,
            '{name: workers, key_env: FENCEPROXY_KEY_W, resources: ["rule:*", "x"], '
            "may: [lease, operate]}",
        )
    )
    assert policy.auth is not None
    ops, workers = policy.auth.clients
    assert (ops.name, ops.key_sha256, ops.key_env, ops.line) == ("ops", DIGEST, None, 15)
    assert (workers.key_env, workers.resources) == ("FENCEPROXY_KEY_W", ("rule:*", "x"))
    assert workers.may == {Right.LEASE, Right.OPERATE}


def test_without_an_auth_block_there_are_no_clients() -> None:
    policy = parse_policy(VALID)
    assert (policy.auth, policy.admin_token_next_env, policy.metrics_listen) == (None, None, None)


def test_a_client_needs_exactly_one_key() -> None:
    both = '{name: c, key_env: K, key_sha256: "' + DIGEST + '", resources: ["*"], may: [read]}'
    assert_single_problem(with_clients(both), 15, "auth.clients[0]", "exactly one of key_env")
    neither = '{name: c, resources: ["*"], may: [read]}'
    assert_single_problem(with_clients(neither), 15, "auth.clients[0]", "exactly one of key_env")


def test_unknown_rights_are_refused() -> None:
    text = with_clients('{name: c, key_env: K, resources: ["*"], may: [read, write]}')
    assert_single_problem(
        text, 15, "auth.clients[0].may[1]", "unknown right 'write' (known: lease, read,"
    )


def test_client_names_are_unique() -> None:
    other = f'{{name: ops, key_sha256: "{"cd" * 32}", resources: ["*"], may: [lease]}}'
    assert_single_problem(
        with_clients(GOOD, other), 16, "auth.clients[1]", "'ops' is already used on line 15"
    )


def test_two_clients_cannot_share_a_key() -> None:
    twin = f'{{name: twin, key_sha256: "{DIGEST.upper()}", resources: ["*"], may: [lease]}}'
    assert_single_problem(with_clients(GOOD, twin), 16, "auth.clients[1]", "client on line 15")


def test_a_malformed_digest_env_name_or_glob_is_refused() -> None:
    short = '{name: c, key_sha256: "abc", resources: ["*"], may: [read]}'
    assert_single_problem(with_clients(short), 15, "auth.clients[0].key_sha256", "64 hex")
    env = '{name: c, key_env: "MY-KEY", resources: ["*"], may: [read]}'
    assert_single_problem(with_clients(env), 15, "auth.clients[0].key_env", "environment")
    glob = '{name: c, key_env: K, resources: ["rule: *"], may: [read]}'
    assert_single_problem(with_clients(glob), 15, "auth.clients[0].resources[0]", "not a resource")


def test_empty_scopes_rights_and_client_lists_are_refused() -> None:
    no_globs = "{name: c, key_env: K, resources: [], may: [read]}"
    assert_single_problem(with_clients(no_globs), 15, "auth.clients[0].resources", "at least one")
    no_rights = '{name: c, key_env: K, resources: ["*"], may: []}'
    assert_single_problem(with_clients(no_rights), 15, "auth.clients[0].may", "at least one")
    assert_single_problem(with_text("auth: {clients: []}"), 13, "auth.clients", "at least one")
    assert_single_problem(
        with_text("auth: {}"), 13, "auth.clients", "missing required key 'clients'"
    )


def test_the_admin_tokens_name_is_reserved() -> None:
    admin = '{name: admin, key_env: K, resources: ["*"], may: [read]}'
    assert_single_problem(with_clients(admin), 15, "auth.clients[0].name", "admin token")


def test_a_second_admin_token_variable_and_a_metrics_listener() -> None:
    policy = parse_policy(
        with_text(
            "admin_token_next_env: FENCEPROXY_ADMIN_TOKEN_NEXT", "metrics_listen: {port: 9100}"
        )
    )
    assert policy.admin_token_next_env == "FENCEPROXY_ADMIN_TOKEN_NEXT"
    assert policy.metrics_listen == Listen("127.0.0.1", 9100)


def test_metrics_cannot_share_the_main_listener() -> None:
    text = with_text("metrics_listen: {host: 127.0.0.1, port: 8080}")
    assert_single_problem(text, 13, "metrics_listen.port", "the main listener's address")
    assert_single_problem(
        with_text("metrics_listen: {port: 70000}"), 13, "metrics_listen.port", "not a TCP port"
    )
    assert_single_problem(
        with_text("metrics_listen: {host: 127.0.0.1}"), 13, "metrics_listen.port", "'port'"
    )


def test_several_problems_are_all_named() -> None:
    text = with_clients(
        '{name: "a b", key_env: K, resources: ["*"], may: [fly]}',
        '{name: c, resources: "*", may: [read]}',
    )
    assert [(p.line, p.key) for p in problems_of(text)] == [
        (15, "auth.clients[0].may[0]"),
        (15, "auth.clients[0].name"),
        (16, "auth.clients[1]"),
        (16, "auth.clients[1].resources"),
    ]


# --- rights, scopes and keys --------------------------------------------------------------


def test_rights_imply_the_lesser_ones() -> None:
    operate = client(may=frozenset({Right.OPERATE}))
    assert operate.holds(Right.READ) and operate.holds(Right.OPERATE)
    assert not operate.holds(Right.LEASE) and not operate.holds(Right.ADMIN)
    lease = client(may=frozenset({Right.LEASE}))
    assert not lease.holds(Right.READ)
    assert all(ADMIN.holds(right) for right in Right)


def test_scopes_are_fnmatch_globs_and_rows_of_no_resource_need_every_resource() -> None:
    scoped = client(resources=("rule:*", "supplier:a?"))
    assert scoped.covers("rule:r1") and scoped.covers("supplier:ab")
    assert not scoped.covers("supplier:abc") and not scoped.covers("Rule:r1")
    assert not scoped.covers(None)
    assert client(resources=("*",)).covers(None)


def test_a_key_matches_its_client_only() -> None:
    key = "k" * 40
    policy = parse_policy(
        with_clients(
            f'{{name: by-digest, key_sha256: "{hashlib.sha256(key.encode()).hexdigest()}", '
            'resources: ["*"], may: [read]}',
            '{name: by-env, key_env: KEY_OF_ENV, resources: ["*"], may: [lease]}',
        )
    )
    credentials = Credentials.of(policy, ["admin-token"], {"KEY_OF_ENV": "env-key"})
    found = [credentials.match(k) for k in (key, "env-key", "admin-token", "other", key + " ")]
    assert [c.name if c else None for c in found] == ["by-digest", "by-env", "admin", None, None]


def test_an_unset_key_variable_or_a_shared_key_is_a_key_problem() -> None:
    policy = parse_policy(
        with_clients('{name: by-env, key_env: KEY_OF_ENV, resources: ["*"], may: [lease]}')
    )
    with pytest.raises(KeyProblem, match=r"auth\.clients\[0\]\.key_env \(line 15\): KEY_OF_ENV"):
        Credentials.of(policy, [], {"KEY_OF_ENV": ""})
    with pytest.raises(KeyProblem, match="'admin' and 'by-env' have the same key"):
        Credentials.of(policy, ["same"], {"KEY_OF_ENV": "same"})


def test_a_key_or_admin_token_with_surrounding_whitespace_matches_without_it() -> None:
    """A presented key is stripped; a configured one kept with its spaces or a secret
    file's newline could never match."""
    policy = parse_policy(
        with_clients('{name: by-env, key_env: KEY_OF_ENV, resources: ["*"], may: [lease]}')
    )
    credentials = Credentials.of(policy, ["\tadmin-token \n"], {"KEY_OF_ENV": "  env-key\n"})
    found = [credentials.match(key) for key in ("env-key", "admin-token")]
    assert [c.name if c else None for c in found] == ["by-env", "admin"]


@pytest.mark.parametrize("blank", ["", " ", "\n", " \t\r\n "])
def test_a_key_variable_of_whitespace_only_is_unset(blank: str) -> None:
    policy = parse_policy(
        with_clients('{name: by-env, key_env: KEY_OF_ENV, resources: ["*"], may: [lease]}')
    )
    (line,) = missing_keys(policy, {"KEY_OF_ENV": blank})
    assert "KEY_OF_ENV is not set" in line
    with pytest.raises(KeyProblem, match="KEY_OF_ENV is not set"):
        Credentials.of(policy, [], {"KEY_OF_ENV": blank})


def test_an_admin_token_variable_of_whitespace_only_is_unset_and_said() -> None:
    policy = parse_policy(with_text("admin_token_next_env: NEXT_TOKEN"))
    policy = replace(policy, admin_token_env="ADMIN_TOKEN")
    environ = {"ADMIN_TOKEN": " \n", "NEXT_TOKEN": " next \n"}
    assert env_secret(environ, "ADMIN_TOKEN") is None
    assert env_secret(environ, "NEXT_TOKEN") == "next"
    assert env_secret(environ, "UNSET") is None
    assert env_secret({"EMPTY": ""}, "EMPTY") is None
    assert blank_admin_token_warnings(policy, environ) == [
        "admin_token_env: ADMIN_TOKEN holds only whitespace: taken as unset"
    ]
    assert blank_admin_token_warnings(policy, {"ADMIN_TOKEN": ""}) == []


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("proxy.internal", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_an_open_lease_api_on_a_non_loopback_listener_is_warned_about() -> None:
    exposed = parse_policy(edit("host: 127.0.0.1", "host: 0.0.0.0"))
    warning = exposure_warning(exposed)
    assert warning is not None and "0.0.0.0:8080" in warning and "\n" not in warning
    assert exposure_warning(parse_policy(VALID)) is None
    guarded = parse_policy(edit("host: 127.0.0.1", "host: 0.0.0.0", with_clients(GOOD)))
    assert exposure_warning(guarded) is None


def test_a_certificate_subject_needs_a_client_ca_and_names_one_client() -> None:
    subject = '{name: w, cert_subject: worker-7, resources: ["*"], may: [lease]}'
    assert_single_problem(
        with_clients(subject), 15, "auth.clients[0]", "cert_subject needs listen.tls.client_ca"
    )
    key_and_subject = (
        '{name: w, key_env: K, cert_subject: worker-7, resources: ["*"], may: [lease]}'
    )
    assert_single_problem(
        with_clients(key_and_subject), 15, "auth.clients[0]", "exactly one of key_env"
    )


def test_a_client_named_by_its_certificate_matches_no_key() -> None:
    named = client(name="w", key_sha256=None, cert_subject="worker-7")
    policy = parse_policy(VALID)
    credentials = Credentials.of(replace(policy, auth=Auth((named,))), [], {})
    assert credentials.subjects == {"worker-7": named}
    assert credentials.keys == ()


@pytest.mark.parametrize(
    ("authorization", "carried"),
    [
        ("Bearer proxy-key", True),
        ("bearer   proxy-key  ", True),
        ("proxy-key", True),
        (" proxy-key ", True),
        ("Bearer upstream-key", False),
        ("Basic proxy-key", False),
        ("Bearer proxy-key-and-more", False),
        ("", False),
    ],
)
def test_an_authorization_carries_a_proxy_credential_only_when_it_presents_a_key(
    authorization: str, carried: bool
) -> None:
    # What upstream forwarding drops: the proxy's own keys, bare or as a bearer credential.
    credentials = Credentials(((hashlib.sha256(b"proxy-key").digest(), ADMIN),), required=False)
    assert credentials.carried_by(authorization) is carried
