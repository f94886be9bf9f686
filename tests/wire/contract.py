"""The wire contract as pure functions: what must reach the upstream, what must reach
the worker (docs/reference/wire.md, "What crosses the proxy"; tests/wire/test_readme_lists.py
keeps that page's lists equal to the sets here).

Each check returns the violations it found, each named by the rule it breaks, so a
known failure can be waived by name (tests/wire/test_differential.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The docs' lists, by name as written there.
ADDED = frozenset(
    {
        "Host",
        "Content-Length",
        "Transfer-Encoding",
        "Fence-Epoch",
        "Fence-Resource",
        "Fence-Effect-Id",
        "Idempotent-Replayed",
        "Date",
        "Server",
        "Content-Type",
    }
)
REMOVED = frozenset(
    {
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
        "Expect",
        "Fence-*",
        "Idempotent-Replayed",
    }
)
NEVER_FORWARDED = frozenset({"Fence-Token", "Authorization"})

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
FRAMING = frozenset({"content-length", "transfer-encoding"})
FENCE_HEADERS = ("fence-epoch", "fence-resource", "fence-effect-id")
REPLAYED = "idempotent-replayed"
# Set by the proxy's HTTP server on its answers when the upstream's answer has none.
SERVER_DEFAULTS = frozenset({b"date", b"server"})
UNTYPED_BODY = b"application/octet-stream"
IDEMPOTENCY_KEY_ALPHABET = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:@"
)
REPLAY_BODY_LIMIT = 1_048_576

Header = tuple[bytes, bytes]


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str


def lower(headers: tuple[Header, ...] | list[Header]) -> list[Header]:
    return [(name.lower(), value) for name, value in headers]


def nominated(headers: list[Header]) -> set[bytes]:
    """Header names listed in Connection: hop-by-hop for this message."""
    return {
        token.strip().lower()
        for name, value in headers
        if name == b"connection"
        for token in value.split(b",")
        if token.strip()
    }


def nominates_meaningful(headers: list[Header]) -> bool:
    """Connection names a header whose removal would change what the request means or
    how it is framed: refused with 400 invalid_request, nothing forwarded
    (docs/reference/wire.md)."""
    return any(name in MEANINGFUL or is_fence_header(name) for name in nominated(headers))


MEANINGFUL = frozenset(
    {b"idempotency-key", b"fence-token", b"content-length", b"transfer-encoding"}
)


# Fields that may appear once (RFC 9110 defines no list syntax for them): a request
# repeating one is refused with 400 by the proxy's HTTP parser, nothing forwarded.
SINGLETONS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    }
)


def repeats_a_singleton(headers: list[Header]) -> bool:
    names = [name for name, _ in headers if name in SINGLETONS]
    return len(names) != len(set(names))


def is_fence_header(name: bytes) -> bool:
    return name.startswith(b"fence-")


def is_proxy_credential(name: bytes, value: bytes, credentials: frozenset[bytes]) -> bool:
    return name == b"authorization" and value.partition(b" ")[2] in credentials


def key_accepted(key: str) -> bool:
    """Idempotency-Key: 1..255 of the contract's alphabet, and not a dot segment."""
    return (
        1 <= len(key) <= 255
        and set(key) <= IDEMPOTENCY_KEY_ALPHABET
        and key
        not in (
            ".",
            "..",
        )
    )


def request_end_to_end(
    worker_headers: tuple[Header, ...], credentials: frozenset[bytes]
) -> list[Header]:
    """The worker's headers that must reach the upstream, in order, duplicates kept."""
    headers = lower(worker_headers)
    dropped = {n.encode() for n in HOP_BY_HOP} | nominated(headers)
    dropped |= {b"host", b"content-length", b"expect"}
    return [
        (name, value)
        for name, value in headers
        if name not in dropped
        and not is_fence_header(name)
        and not is_proxy_credential(name, value, credentials)
    ]


def check_upstream_request(
    *,
    method: str,
    target: bytes,
    worker_headers: tuple[Header, ...],
    body: bytes,
    worker_framed: bool,
    received: dict[str, Any],
    fence: dict[bytes, bytes] | None,
    authority: bytes,
    credentials: frozenset[bytes],
) -> list[Violation]:
    """Rule 1: the upstream received the worker's request less the documented list, plus
    the route's fence headers, Host and Content-Length framing. `received` is the
    recording upstream's decoded log record; `fence` the fence headers the route adds
    (values None: any value), None for a pass-through route."""
    found: list[Violation] = []
    if received["method"] != method.encode() or received["target"] != target:
        found.append(
            Violation(
                "request_target",
                f"sent {method} {target!r}, upstream got "
                f"{received['method']!r} {received['target']!r}",
            )
        )
    if received["body"] != body:
        found.append(
            Violation(
                "request_body",
                f"sent {len(body)} body bytes, upstream got {len(received['body'])}",
            )
        )
    got = lower(received["headers"])
    sent_pairs = set(lower(worker_headers))
    framing = [(n, v) for n, v in got if n in (b"host", b"content-length", b"transfer-encoding")]
    expected_framing: list[Header] = [(b"host", authority)]
    if body or worker_framed:
        expected_framing.append((b"content-length", str(len(body)).encode()))
    if sorted(framing) != sorted(expected_framing) and not (
        not body and worker_framed and sorted(framing) == [(b"host", authority)]
    ):
        found.append(
            Violation("request_framing", f"expected {expected_framing!r}, got {framing!r}")
        )
    fence_got = {(n, v) for n, v in got if is_fence_header(n)}
    fence_wanted = set((fence or {}).items())
    if len([n for n, _ in got if is_fence_header(n)]) != len(fence_wanted) or not all(
        any(n == wn and (wv == b"" or v == wv) for n, v in fence_got) for wn, wv in fence_wanted
    ):
        found.append(
            Violation("request_fence_headers", f"expected {fence_wanted!r}, got {fence_got!r}")
        )
    rest = [(n, v) for n, v in got if n not in (b"host", b"content-length", b"transfer-encoding")]
    rest = [(n, v) for n, v in rest if not is_fence_header(n)]
    expected = request_end_to_end(worker_headers, credentials)
    # A name the worker sent that must not pass (hop-by-hop, named in Connection) and
    # yet reaches the upstream is an addition too, when its value is not the worker's.
    passing = {n for n, _ in expected} | {
        n for n, v in lower(worker_headers) if is_proxy_credential(n, v, credentials)
    }
    additions = [(n, v) for n, v in rest if n not in passing and (n, v) not in sent_pairs]
    if additions:
        found.append(Violation("request_no_additions", f"the proxy added {additions!r}"))
    rest = [(n, v) for n, v in rest if (n, v) not in additions]
    leaked = [
        (n, v) for n, v in rest if is_proxy_credential(n, v, credentials) and (n, v) not in expected
    ]
    if leaked:
        found.append(Violation("request_credentials", "a credential of the proxy was forwarded"))
    rest = [(n, v) for n, v in rest if (n, v) not in leaked]
    if rest != expected:
        found.append(
            Violation("request_headers", f"expected end-to-end {expected!r}, got {rest!r}")
        )
    return found


def response_end_to_end(upstream_headers: list[Header]) -> list[Header]:
    """The upstream's answer headers that must reach the worker, in order."""
    headers = lower(upstream_headers)
    dropped = {n.encode() for n in HOP_BY_HOP} | nominated(headers) | FRAMING_BYTES
    return [
        (name, value)
        for name, value in headers
        if name not in dropped and not is_fence_header(name) and name != REPLAYED.encode()
    ]


FRAMING_BYTES = frozenset(name.encode() for name in FRAMING)


def owned_by_proxy(name: bytes) -> bool:
    return is_fence_header(name) or name == REPLAYED.encode()


def check_worker_answer(
    *,
    status: int,
    reason: bytes,
    upstream_headers: list[Header],
    body: bytes,
    answer_status: int | None,
    answer_reason: bytes,
    answer_headers: tuple[Header, ...],
    answer_body: bytes,
    answer_complete: bool,
    own: dict[bytes, bytes | None],
) -> list[Violation]:
    """Rule 2: the worker received the upstream's status, reason, end-to-end headers and
    body, less the documented list, plus the proxy's own headers (`own`: name to value,
    None for any value; Date and Server only where the upstream sent none)."""
    found: list[Violation] = []
    if answer_status != status:
        found.append(
            Violation("response_status", f"upstream said {status}, worker got {answer_status}")
        )
        return found
    if answer_reason != reason:
        found.append(
            Violation("response_reason", f"upstream said {reason!r}, worker got {answer_reason!r}")
        )
    if not answer_complete or answer_body != body:
        found.append(
            Violation(
                "response_body",
                f"upstream sent {len(body)} bytes, worker got {len(answer_body)} "
                f"(complete: {answer_complete})",
            )
        )
    got = lower(answer_headers)
    hop = {n.encode() for n in HOP_BY_HOP} | FRAMING_BYTES
    got = [(n, v) for n, v in got if n not in hop]
    owned = [(n, v) for n, v in got if owned_by_proxy(n)]
    wrong_owned = len(owned) != len(own) or any(own.get(n, b"?") not in (None, v) for n, v in owned)
    if wrong_owned:
        found.append(
            Violation(
                "response_owned_headers",
                f"the proxy's own headers should be {own!r}, the worker got {owned!r}",
            )
        )
    rest = [(n, v) for n, v in got if not owned_by_proxy(n)]
    expected = response_end_to_end(upstream_headers)
    expected_names = {n for n, _ in expected}
    rest = [(n, v) for n, v in rest if not (n in SERVER_DEFAULTS and n not in expected_names)]
    # aiohttp's server types an untyped body; the docs list it as added.
    rest = [
        (n, v)
        for n, v in rest
        if not (n == b"content-type" and v == UNTYPED_BODY and n not in expected_names)
    ]
    sent_pairs = set(lower(upstream_headers))
    additions = [(n, v) for n, v in rest if n not in expected_names and (n, v) not in sent_pairs]
    if additions:
        found.append(Violation("response_no_additions", f"the proxy added {additions!r}"))
    rest = [(n, v) for n, v in rest if (n, v) not in additions]
    if rest != expected:
        found.append(
            Violation("response_headers", f"expected end-to-end {expected!r}, got {rest!r}")
        )
    return found


def check_replay(
    *,
    first_status: int | None,
    first_reason: bytes,
    first_headers: tuple[Header, ...],
    first_body: bytes,
    replay_status: int | None,
    replay_reason: bytes,
    replay_headers: tuple[Header, ...],
    replay_body: bytes,
) -> list[Violation]:
    """Rule 3: a replay is the first answer again (less Set-Cookie), with
    Idempotent-Replayed: true; a first body over the replay limit is stated as not
    kept, never served cut."""
    found: list[Violation] = []

    def end_to_end(headers: tuple[Header, ...]) -> list[Header]:
        skip = {n.encode() for n in HOP_BY_HOP} | FRAMING_BYTES | SERVER_DEFAULTS
        kept = [(n, v) for n, v in lower(headers) if n not in skip and n != b"set-cookie"]
        # a CIMultiDict: order between names is free, order within one name is kept
        return sorted(kept, key=lambda item: item[0])

    if b"true" not in [v for n, v in lower(replay_headers) if n == REPLAYED.encode()]:
        found.append(Violation("replay_marked", "a replay without Idempotent-Replayed: true"))
    if len(first_body) > REPLAY_BODY_LIMIT:
        if replay_body == first_body:
            return found
        try:
            statement = json.loads(replay_body)
        except ValueError:
            statement = None
        if not isinstance(statement, dict) or str(first_status) not in json.dumps(statement):
            found.append(
                Violation(
                    "replay_identical",
                    f"first body {len(first_body)} bytes (over the replay limit); the replay "
                    f"is {replay_status} with {len(replay_body)} bytes, not a statement",
                )
            )
        return found
    replayed = [(n, v) for n, v in end_to_end(replay_headers) if n != REPLAYED.encode()]
    first = [(n, v) for n, v in end_to_end(first_headers) if n != REPLAYED.encode()]
    same = (
        first_status == replay_status
        and first_reason == replay_reason
        and first_body == replay_body
        and first == replayed
    )
    if not same:
        found.append(
            Violation(
                "replay_identical",
                f"first {first_status} {first_reason!r} {first!r} ({len(first_body)} B), "
                f"replay {replay_status} {replay_reason!r} {replayed!r} ({len(replay_body)} B)",
            )
        )
    return found
