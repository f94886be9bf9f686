"""The CLI and the admin API are two faces of proxy/operations.py: for the same bad
input they give the same refusal (the CLI's one line is the problem's detail and code),
and `GET /_fence/v1/reconcile` is `fenceproxy reconcile list --json`.

Both run against the same store (SQLite and PostgreSQL): the app in process; the CLI
through its entry point for the refusals (many commands) and as the installed console
script for the listing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import ClientResponse

from core.records import EffectState
from proxy import cli, operations
from proxy.operations import MAX_TEXT_CHARS
from store import open_store
from tests.integration.app.conftest import (
    Fence,
    FenceFactory,
    Json,
    assert_problem,
    json_body,
)
from tests.integration.app.test_reconcile import (
    DROP,
    FAIL_503,
    RESOURCE,
    CliResult,
    dispatching,
    fenceproxy,
    new_effect,
    probed,
    unknown_effect,
    wait_for_effect,
)

LONG_REASON = "r" * (MAX_TEXT_CHARS + 1)
# How far apart the API's and the CLI's `age_s` of one effect may be: time passes
# between the two reads, and on SQLite the app reads the test's frozen clock while the
# CLI reads the real one (they start together; the test does not advance it).
AGE_TOLERANCE_S = 30.0


@dataclass(frozen=True)
class Same:
    """One bad input, as an admin API call and as a CLI command; `{effect}` in either
    is a COMMITTED effect of the test's store."""

    method: str
    path: str
    json: Json | None
    cli: tuple[str, ...]
    status: int
    code: str


def resolve_call(
    outcome: str, reason: str, operator: str, status: int, code: str, effect: str = "{effect}"
) -> Same:
    return Same(
        "POST",
        f"/_fence/v1/effects/{effect}/resolve",
        {"outcome": outcome, "reason": reason, "operator": operator},
        (
            *("reconcile", "resolve", effect),
            *("--outcome", outcome, "--reason", reason, "--operator", operator),
        ),
        status,
        code,
    )


SAME: dict[str, Same] = {
    "resolve-settled": resolve_call(
        "not-committed", "second thoughts", "bob", 409, "effect_settled"
    ),
    "resolve-missing": resolve_call(
        "committed", "found", "bob", 404, "not_found", effect="eff_nope"
    ),
    "resolve-bad-outcome": resolve_call("maybe", "unsure", "bob", 400, "invalid_request"),
    "resolve-empty-reason": resolve_call("committed", " ", "bob", 400, "invalid_request"),
    "resolve-long-reason": resolve_call("committed", LONG_REASON, "bob", 400, "invalid_request"),
    "resolve-empty-operator": resolve_call("committed", "found", "", 400, "invalid_request"),
    "probe-committed": Same(
        "POST",
        "/_fence/v1/effects/{effect}/probe",
        None,
        ("reconcile", "probe", "{effect}"),
        409,
        "effect_settled",
    ),
    "probe-missing": Same(
        "POST",
        "/_fence/v1/effects/eff_nope/probe",
        None,
        ("reconcile", "probe", "eff_nope"),
        404,
        "not_found",
    ),
    "show-missing": Same(
        "GET",
        "/_fence/v1/effects/eff_nope",
        None,
        ("effects", "show", "eff_nope"),
        404,
        "not_found",
    ),
    "lease-view-bad-resource": Same(
        "GET",
        "/_fence/v1/leases?resource=not%20valid",
        None,
        ("leases", "show", "not valid"),
        400,
        "invalid_request",
    ),
    "revoke-bad-resource": Same(
        "POST",
        "/_fence/v1/admin/revoke",
        {"resource": "a b", "reason": "host lost"},
        ("leases", "revoke", "a b", "--reason", "host lost"),
        400,
        "invalid_request",
    ),
    "revoke-empty-reason": Same(
        "POST",
        "/_fence/v1/admin/revoke",
        {"resource": RESOURCE, "reason": "  "},
        ("leases", "revoke", RESOURCE, "--reason", "  "),
        400,
        "invalid_request",
    ),
    "revoke-long-reason": Same(
        "POST",
        "/_fence/v1/admin/revoke",
        {"resource": RESOURCE, "reason": LONG_REASON},
        ("leases", "revoke", RESOURCE, "--reason", LONG_REASON),
        400,
        "invalid_request",
    ),
    "effects-bad-limit": Same(
        "GET",
        "/_fence/v1/effects?limit=0",
        None,
        ("effects", "list", "--limit", "0"),
        400,
        "invalid_request",
    ),
    "effects-bad-state": Same(
        "GET",
        "/_fence/v1/effects?state=committed",
        None,
        ("effects", "list", "--state", "committed"),
        400,
        "invalid_request",
    ),
    "effects-bad-resource": Same(
        "GET",
        "/_fence/v1/effects?resource=a%20b",
        None,
        ("effects", "list", "--resource", "a b"),
        400,
        "invalid_request",
    ),
    "rejections-bad-limit": Same(
        "GET",
        "/_fence/v1/rejections?limit=1001",
        None,
        ("effects", "rejections", "--limit", "1001"),
        400,
        "invalid_request",
    ),
    **{
        f"lease-advice-{option}-{value}": Same(
            "GET",
            f"/_fence/v1/lease-advice?{option}={quote(value)}",
            None,
            ("lease-advice", f"--{option.replace('_', '-')}", value),
            400,
            "invalid_request",
        )
        for option, value in (
            ("since", "0"),
            ("since", "nan"),
            ("margin", "0.5"),
            ("margin", "1_0"),
            ("poll_interval", "-1"),
            ("targets", "0.5,1.5"),
            ("targets", "0.5,,0.1"),
            ("leases", "0,1e9"),
            ("leases", "inf"),
            ("resource", "a b"),
        )
    },
}


async def committed_effect(fence: Fence) -> str:
    """An order whose answer was lost (UNKNOWN), then resolved COMMITTED by an operator."""
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    effect_id = await unknown_effect(fence, lease["token"], "k-1", DROP)
    settled = await operations.resolve(fence.store, effect_id, "committed", "found", "alice")
    assert settled.state is EffectState.COMMITTED
    return effect_id


def filled(text: str, effect_id: str) -> str:
    return text.replace("{effect}", effect_id)


async def call_api(fence: Fence, same: Same, effect_id: str) -> ClientResponse:
    payload: Any = None
    if same.json is not None:
        payload = {key: filled(str(value), effect_id) for key, value in same.json.items()}
    return await fence.client.request(
        same.method, filled(same.path, effect_id), json=payload, headers=fence.admin
    )


def cli_main(config: str, *command: str) -> CliResult:
    """`fenceproxy COMMAND --config CONFIG` through the CLI's own entry point, in this
    process: a console script per case would spend seconds importing (tests/acceptance
    runs the installed script). Call it from a thread: it runs its own event loop."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main([*command, "--config", config])
        except SystemExit as exit_:
            code = exit_.code
        else:
            raise AssertionError(f"fenceproxy {command} did not exit")
    assert isinstance(code, int), code
    return CliResult(code, out.getvalue(), err.getvalue())


async def test_the_cli_and_the_admin_api_refuse_alike(make_fence: FenceFactory) -> None:
    fence = await make_fence()
    assert fence.config_path is not None
    config = str(fence.config_path)
    effect_id = await committed_effect(fence)
    problems = {
        case: await assert_problem(await call_api(fence, same, effect_id), same.status, same.code)
        for case, same in SAME.items()
    }
    results = [
        await asyncio.to_thread(cli_main, config, *(filled(arg, effect_id) for arg in same.cli))
        for same in SAME.values()
    ]

    said = {
        case: (result.code, result.out, result.err.splitlines())
        for case, result in zip(SAME, results, strict=True)
    }
    assert said == {
        case: (1, "", [f"fenceproxy: {problem['detail']} ({problem['code']})"])
        for case, problem in problems.items()
    }


# --- the in-doubt listing: GET /_fence/v1/reconcile == reconcile list --json --------------------


async def in_doubt_from_api(fence: Fence) -> Json:
    response = await fence.client.get("/_fence/v1/reconcile", headers=fence.admin)
    body = await json_body(response)
    assert response.status == 200, body
    return body


def without_ages(listing: Json) -> tuple[Json, list[float]]:
    entries = [dict(entry) for entry in listing["in_doubt"]]
    ages = [entry.pop("age_s") for entry in entries]
    return {**listing, "in_doubt": entries}, ages


async def test_the_in_doubt_endpoint_is_the_cli_listing(make_fence: FenceFactory) -> None:
    fence = await make_fence()
    assert fence.config_path is not None
    config = str(fence.config_path)
    # One effect waiting for an operator (no reconcile block) ...
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    waiting = await unknown_effect(fence, lease["token"], "k-1", FAIL_503)
    # ... once the background has recorded that it cannot probe it: nothing changes after.
    await wait_for_effect(fence, waiting, "a probe attempt", probed)
    # And one request another replica has in flight, well within its deadline.
    other = await fence.acquire("supplier:gadget", "worker-c", ttl_s=30)
    replica = open_store(fence.store_url, fence.clock, "replica-2:8080")
    await replica.open()
    try:
        in_flight = await dispatching(
            replica, other["token"], new_effect("supplier:gadget", "g", upstream_timeout_s=20)
        )
    finally:
        await replica.close()

    from_api = await in_doubt_from_api(fence)
    from_cli = (await fenceproxy("reconcile", "list", "--json", "--config", config)).json()

    assert [entry["id"] for entry in from_api["in_doubt"]] == [waiting, in_flight]
    assert from_api["blocked_resources"] == [RESOURCE]
    api_listing, api_ages = without_ages(from_api)
    cli_listing, cli_ages = without_ages(from_cli)
    assert api_listing == cli_listing
    assert cli_ages == pytest.approx(api_ages, abs=AGE_TOLERANCE_S)
    assert all(age >= 0 for age in api_ages)


async def test_the_in_doubt_endpoint_on_an_empty_store(fence: Fence) -> None:
    assert fence.config_path is not None
    empty: Json = {"blocked_resources": [], "in_doubt": []}
    assert await in_doubt_from_api(fence) == empty
    listed = await fenceproxy("reconcile", "list", "--json", "--config", str(fence.config_path))
    assert listed.json() == empty


async def test_the_in_doubt_endpoint_needs_the_admin_token(fence: Fence) -> None:
    response = await fence.client.get("/_fence/v1/reconcile")
    await assert_problem(response, 401, "unauthorized")


# --- what the CLI prints of stored strings ---------------------------------------------------

ESCAPE = "\x1b[31m"


async def test_the_cli_prints_stored_paths_reasons_and_operators_escaped(
    make_fence: FenceFactory,
) -> None:
    """Anyone can store a path, and a reason or an operator's name comes from whoever
    resolves: none of them may reach the operator's terminal as an escape sequence."""
    fence = await make_fence()
    assert fence.config_path is not None
    config = str(fence.config_path)
    refused = await fence.client.get("/esc%1B%5B31mRED")
    await assert_problem(refused, 404, "no_route")
    await fence.store.flush_refusal_counts()
    lease = await fence.acquire(RESOURCE, "worker-a", ttl_s=30)
    effect_id = await unknown_effect(fence, lease["token"], "k-1", DROP)
    await operations.resolve(
        fence.store, effect_id, "committed", f"found {ESCAPE}it", f"al{ESCAPE}ice"
    )

    rejections = await asyncio.to_thread(cli_main, config, "effects", "rejections")
    shown = await asyncio.to_thread(cli_main, config, "effects", "show", effect_id)

    for result in (rejections, shown):
        assert result.code == 0, result.err
        assert "\x1b" not in result.out, result.out
    assert "/esc\\x1b[31mRED" in rejections.out
    assert "found \\x1b[31mit" in shown.out
    assert "al\\x1b[31mice" in shown.out
