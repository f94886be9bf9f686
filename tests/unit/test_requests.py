"""Request validation helpers and the request fingerprint."""

from __future__ import annotations

import asyncio
import re
import string
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from core.records import Refusal
from policies import LeaseBounds
from proxy.requests import (
    BODY_TIMEOUT,
    MAX_HEADER_TOTAL,
    MAX_HEADER_VALUE,
    check_header_encoding,
    check_header_sizes,
    fingerprint,
    holder_name,
    idempotency_key,
    read_body,
    single_header,
    ttl,
    valid_idempotency_key,
)

BOUNDS = LeaseBounds(min_ttl_s=1, max_ttl_s=300, default_ttl_s=30)


def mocked(*headers: tuple[str, str]) -> web.Request:
    return make_mocked_request("POST", "/orders/widget", headers=CIMultiDict(headers))


def invalid_request(error: pytest.ExceptionInfo[Refusal]) -> Refusal:
    assert error.value.code == "invalid_request"
    return error.value


# --- fingerprint ------------------------------------------------------------------------

BASE = ("POST", "/orders/widget", "a=1", b'{"qty": 2}')


def test_fingerprint_is_stable() -> None:
    assert fingerprint(*BASE) == fingerprint(*BASE)
    assert fingerprint(*BASE) == fingerprint("POST", "/orders/widget", "a=1", b'{"qty": 2}')


def test_fingerprint_is_a_sha256_hex_digest() -> None:
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint(*BASE))


def test_fingerprint_differs_by_method() -> None:
    assert fingerprint("PUT", *BASE[1:]) != fingerprint(*BASE)


def test_fingerprint_differs_by_path() -> None:
    assert fingerprint("POST", "/orders/gadget", *BASE[2:]) != fingerprint(*BASE)


def test_fingerprint_differs_by_query() -> None:
    assert fingerprint("POST", "/orders/widget", "a=2", BASE[3]) != fingerprint(*BASE)
    assert fingerprint("POST", "/orders/widget", "", BASE[3]) != fingerprint(*BASE)


def test_fingerprint_differs_by_body() -> None:
    assert fingerprint(*BASE[:3], b'{"qty": 3}') != fingerprint(*BASE)
    assert fingerprint(*BASE[:3], b"") != fingerprint(*BASE)


def test_fingerprint_keeps_parts_apart() -> None:
    # Moving characters from one part to the next must not give the same fingerprint.
    assert fingerprint("POST", "/a", "b=1", b"") != fingerprint("POST", "/ab", "=1", b"")
    assert fingerprint("POST", "/a?b=1", "", b"") != fingerprint("POST", "/a", "b=1", b"")
    assert fingerprint("GE", "T/a", "", b"") != fingerprint("GET", "/a", "", b"")


# --- holder names (resource names: test_operation_inputs.py) ----------------------------


@pytest.mark.parametrize("value", ["w", "worker-1", "host.a:pid_9@zone", "H" * 128])
def test_valid_holder_names_are_returned(value: str) -> None:
    assert holder_name(value) == value


@pytest.mark.parametrize("value", ["", "H" * 129, "a/b", "a+b", "a=b", "two words", "w\n", 7, None])
def test_bad_holder_names_are_invalid_request(value: object) -> None:
    with pytest.raises(Refusal) as error:
        holder_name(value)
    assert "holder must be 1-128 characters" in invalid_request(error).detail


# --- ttl --------------------------------------------------------------------------------


def test_absent_ttl_is_the_default() -> None:
    assert ttl({}, BOUNDS) == 30


@pytest.mark.parametrize(("value", "expected"), [(1, 1.0), (300, 300.0), (12.5, 12.5)])
def test_ttl_within_bounds_inclusive_is_accepted(value: float, expected: float) -> None:
    result = ttl({"ttl_s": value}, BOUNDS)
    assert result == expected
    assert isinstance(result, float)


@pytest.mark.parametrize("value", [0.999, 300.001, 0, -5, float("inf"), float("-inf")])
def test_ttl_outside_bounds_is_invalid_request(value: float) -> None:
    with pytest.raises(Refusal) as error:
        ttl({"ttl_s": value}, BOUNDS)
    problem = invalid_request(error)
    assert problem.detail == "ttl_s must be between 1 and 300"
    assert problem.context == {"min_ttl_s": 1, "max_ttl_s": 300}


@pytest.mark.parametrize("value", [None, True, False, "30", float("nan"), [30], {"s": 30}])
def test_ttl_that_is_not_a_number_is_invalid_request(value: object) -> None:
    with pytest.raises(Refusal) as error:
        ttl({"ttl_s": value}, BOUNDS)
    assert invalid_request(error).detail == "ttl_s must be a number of seconds"


# --- headers ----------------------------------------------------------------------------


def test_idempotency_key_is_read_unchanged() -> None:
    assert idempotency_key(mocked(("Idempotency-Key", "order-1:a@b~c_d.e"))) == "order-1:a@b~c_d.e"


# RFC 3986 §3.3 unreserved characters, ':' and '@': a path segment no layer rewrites.
ALLOWED = string.ascii_letters + string.digits + "-._~:@"


@pytest.mark.parametrize("key", [*ALLOWED.replace(".", ""), "...", "..a", "a..", ".a", ALLOWED])
def test_a_key_of_unreserved_characters_colon_and_at_is_accepted(key: str) -> None:
    assert valid_idempotency_key(key)
    assert idempotency_key(mocked(("Idempotency-Key", key))) == key


@pytest.mark.parametrize(
    "key", [".", "..", "a/b", "%2E", "a%2Fb", "a?b", "a#b", "a;b", "a+b", "a=b", "a!b", "a,b"]
)
def test_a_dot_segment_or_a_character_a_url_layer_may_rewrite_is_refused(key: str) -> None:
    # "." and ".." are removed from a path by RFC 3986 §5.2.4; '/', '?', '#' end or split
    # the segment; '%' is decoded by the upstream; sub-delims are re-quoted by some clients.
    assert not valid_idempotency_key(key)
    with pytest.raises(Refusal) as error:
        idempotency_key(mocked(("Idempotency-Key", key)))
    assert "A-Z a-z 0-9 - . _ ~ : @" in invalid_request(error).detail


def test_a_key_with_any_other_character_is_refused() -> None:
    for code in range(0x20000):
        if chr(code) not in ALLOWED:
            assert not valid_idempotency_key(f"k{chr(code)}"), hex(code)


def test_a_header_value_that_is_not_utf8_is_invalid_request() -> None:
    # aiohttp holds bytes that are not UTF-8 as surrogates (surrogateescape).
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")
    check_header_encoding(CIMultiDict([("X-Name", "café")]))
    with pytest.raises(Refusal) as error:
        check_header_encoding(CIMultiDict([("X-Ok", "1"), ("X-Name", undecodable)]))
    assert invalid_request(error).detail == "the value of header X-Name is not UTF-8"


def test_absent_idempotency_key_is_none() -> None:
    assert idempotency_key(mocked()) is None


@pytest.mark.parametrize("value", ["has space", "k" * 256, "tab\tkey", "ümlaut"])
def test_bad_idempotency_key_is_invalid_request(value: str) -> None:
    with pytest.raises(Refusal) as error:
        idempotency_key(mocked(("Idempotency-Key", value)))
    assert "Idempotency-Key must be 1-255 characters of" in invalid_request(error).detail


def test_longest_idempotency_key_is_accepted() -> None:
    assert idempotency_key(mocked(("Idempotency-Key", "k" * 255))) == "k" * 255


def test_header_sent_twice_is_ambiguous() -> None:
    request = mocked(("Fence-Token", "a"), ("Fence-Token", "b"))
    with pytest.raises(Refusal) as error:
        single_header(request, "Fence-Token")
    assert "appears more than once" in invalid_request(error).detail


def test_idempotency_key_sent_twice_is_invalid_request() -> None:
    with pytest.raises(Refusal) as error:
        idempotency_key(mocked(("Idempotency-Key", "a"), ("Idempotency-Key", "a")))
    invalid_request(error)


def test_single_header_returns_the_one_value_or_none() -> None:
    request = mocked(("Fence-Token", "tok"))
    assert single_header(request, "fence-token") == "tok"
    assert single_header(request, "Idempotency-Key") is None


def test_header_value_over_the_limit_is_refused_and_at_the_limit_passes() -> None:
    check_header_sizes(mocked(("X-Big", "v" * MAX_HEADER_VALUE)))  # does not raise
    with pytest.raises(Refusal) as error:
        check_header_sizes(mocked(("X-Big", "v" * (MAX_HEADER_VALUE + 1))))
    assert error.value.code == "headers_too_large"


def test_headers_over_the_total_limit_are_refused() -> None:
    count = MAX_HEADER_TOTAL // MAX_HEADER_VALUE + 1
    headers = [(f"X-H{i}", "v" * MAX_HEADER_VALUE) for i in range(count)]
    with pytest.raises(Refusal) as error:
        check_header_sizes(mocked(*headers))
    assert error.value.code == "headers_too_large"


async def test_declared_body_over_the_limit_is_refused_before_reading() -> None:
    request = mocked(("Content-Length", "101"))
    with pytest.raises(Refusal) as error:
        await read_body(request, 100)
    assert error.value.code == "payload_too_large"
    assert error.value.context == {"limit": 100}


def _body_request(declared: int, arrived: bytes, ended: bool, timeout_s: float) -> web.Request:
    app = web.Application()
    app[BODY_TIMEOUT] = timeout_s
    payload = StreamReader(mock.Mock(), 2**16, loop=asyncio.get_running_loop())
    payload.feed_data(arrived)
    if ended:
        payload.feed_eof()
    return make_mocked_request(
        "POST",
        "/orders/widget",
        headers=CIMultiDict({"Content-Length": str(declared)}),
        payload=payload,
        app=app,
    )


async def test_a_body_all_here_is_read_without_arming_the_body_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A timer is armed only for bytes still to come: a small body arrives with its head,
    and a timer per request was CPU on every fenced write."""
    armed: list[float | None] = []
    timeout = asyncio.timeout

    def counted(delay: float | None) -> asyncio.Timeout:
        armed.append(delay)
        return timeout(delay)

    monkeypatch.setattr(asyncio, "timeout", counted)
    assert await read_body(_body_request(4, b"body", True, 5.0), 100) == b"body"
    assert armed == []
    with pytest.raises(Refusal) as error:
        await read_body(_body_request(8, b"body", False, 0.01), 100)  # 4 bytes never come
    assert error.value.code == "request_timeout"
    assert armed == [0.01]
