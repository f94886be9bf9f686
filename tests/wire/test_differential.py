"""The differential test: what goes in comes out, against real processes.

A raw worker (tests/wire/raw_client.py) sends the bytes Hypothesis built to
`fenceproxy serve`; the recording upstream (tests/wire/recording_upstream.py) logs
the bytes it gets and answers as the example scripts; tests/wire/contract.py says
what each side must see. Rules, by the names a violation carries:

1. request_*: the upstream got the worker's method, target, end-to-end headers and
   body, less the documented list, plus the route's fence headers;
2. response_*: the worker got the upstream's status, reason, end-to-end headers and
   body, less the documented list, plus the proxy's own headers;
3. replay_*: a replay is the first answer again;
4. probe_path_decodes, key_alphabet: every accepted Idempotency-Key is one of the
   contract's alphabet, and the probe path the upstream sees decodes back to it;
5. truthful_failure: whatever the upstream does, the worker is never told something
   the upstream's own log contradicts.

Known failures of the code under test are waived by rule name: WAIVED_BY_DEFAULT,
or the comma-separated WIRE_WAIVE (set, even empty, it replaces the default). A
waived violation is shown with `note()`, never asserted. WIRE_EXAMPLES sets the
examples per test (`make fuzz-http`), WIRE_DATABASE Hypothesis's database directory,
WIRE_REPORT a file that collects every violation seen (one JSON line each), waived
or not.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, unquote_to_bytes

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from tests.wire import contract
from tests.wire.conftest import MAX_BODY_BYTES, WireStack, wait_for
from tests.wire.raw_client import WorkerAnswer, WorkerRequest, exchange
from tests.wire.recording_upstream import body_bytes, header_text

# Rules the code on main broke before the wire-fixes branch, each with the
# explicit @example below that shows it: remove each rule here once it is fixed. The
# three marked "still" also fail on wire-fixes as of 4169ba0; the others pass there.
WAIVED_BY_DEFAULT: frozenset[str] = frozenset()


def waived_rules() -> frozenset[str]:
    configured = os.environ.get("WIRE_WAIVE")
    if configured is None:
        return WAIVED_BY_DEFAULT
    return frozenset(rule.strip() for rule in configured.split(",") if rule.strip())


def settle(violations: list[contract.Violation]) -> None:
    """Fail on every violation of a rule that is not waived; note the waived ones."""
    waived = waived_rules()
    report = os.environ.get("WIRE_REPORT")
    if report and violations:
        with open(report, "a", encoding="utf-8") as out:
            for violation in violations:
                out.write(json.dumps({"rule": violation.rule, "detail": violation.detail[:600]}))
                out.write("\n")
    for violation in violations:
        note(f"{'waived ' if violation.rule in waived else ''}{violation.rule}: {violation.detail}")
    failing = [v for v in violations if v.rule not in waived]
    assert not failing, "\n".join(f"{v.rule}: {v.detail}" for v in failing)


EXAMPLES = int(os.environ.get("WIRE_EXAMPLES", "60"))
DATABASE = os.environ.get("WIRE_DATABASE")
wire_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=DirectoryBasedExampleDatabase(DATABASE) if DATABASE else None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- what a worker sends ---------------------------------------------------------------

PCHAR = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@"
PERCENT = ["%20", "%2F", "%25", "%41", "%C3%A9", "%3F", "%23", "%0A", "%0D", "%00", "%FF"]
# Any byte, percent-encoded in either case of hex digit: the target passes byte for byte.
encoded_byte = st.builds(
    lambda byte, upper: f"%{byte:02X}" if upper else f"%{byte:02x}",
    st.integers(0, 255),
    st.booleans(),
)
percent = st.one_of(st.sampled_from(PERCENT), encoded_byte)
segment = (
    st.lists(st.one_of(st.sampled_from(list(PCHAR)), percent), min_size=1, max_size=8)
    .map("".join)
    .filter(lambda s: s not in (".", ".."))
)
path_rest = st.lists(segment, min_size=1, max_size=3).map("/".join)
query = st.one_of(
    st.just(""),
    st.just("?"),
    st.lists(st.one_of(st.sampled_from([*PCHAR, "/", "?"]), percent), max_size=12)
    .map("".join)
    .map(lambda q: "?" + q),
)

# Names the proxy treats specially, and plain ones (twice, so duplicates are common).
SPECIAL_NAMES = [
    "Keep-Alive",
    "Proxy-Connection",
    "Proxy-Authorization",
    "TE",
    "Trailer",
    "Trailers",
    "Upgrade",
    "Fence-Epoch",
    "Fence-Custom",
    "Idempotent-Replayed",
    "Authorization",
    "Forwarded",
    "X-Forwarded-For",
    "Via",
    "Cookie",
    "Accept",
    "Accept-Encoding",
    "User-Agent",
    "Content-Type",
    "Expect",
]
plain_name = st.sampled_from(["X-Wire-A", "X-Wire-B", "x-wire-a", "Accept"])
header_name = st.one_of(
    st.sampled_from(SPECIAL_NAMES),
    plain_name,
    st.from_regex(r"\AX-[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}\Z"),
)
ascii_value = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=20)
utf8_value = st.text(st.sampled_from(list("aé€ 😀ü")), min_size=1, max_size=6).map(
    lambda text: "x" + text + "x"
)
header_value_text = st.one_of(ascii_value, utf8_value)
invalid_utf8 = st.binary(min_size=1, max_size=4).map(
    lambda raw: b"x" + bytes(b | 0x80 for b in raw)
)


ADMIN_CREDENTIAL = b"Bearer <the admin token>"  # replaced by the real token when sent


@st.composite
def worker_headers(draw: st.DrawFn, allow_invalid: bool) -> tuple[tuple[bytes, bytes], ...]:
    headers: list[tuple[bytes, bytes]] = []
    for _ in range(draw(st.integers(0, 6))):
        name = draw(header_name)
        if name == "Authorization" and draw(st.booleans()):
            value = ADMIN_CREDENTIAL
        elif name == "Expect":
            value = b"100-continue"  # any other expectation is refused (417)
        elif allow_invalid and draw(st.integers(0, 9)) == 0:
            value = draw(invalid_utf8)
        else:
            value = draw(header_value_text).encode()
        headers.append((name.encode(), value))
    if draw(st.booleans()):
        names = [n.decode() for n, _ in headers if n.lower() != b"upgrade"]
        nominated = draw(st.lists(st.sampled_from([*names, "keep-alive", "close"]), max_size=3))
        if nominated:
            at = draw(st.integers(0, len(headers)))
            headers.insert(at, (b"Connection", ", ".join(nominated).encode()))
    return tuple(headers)


BIG_SIZES = [65535, 65537, 300_000, 1_048_576, 1_048_577, 3_000_000]
body_spec = st.one_of(
    st.binary(max_size=200).map(lambda raw: {"literal": base64.b64encode(raw).decode()}),
    st.builds(
        lambda size, seed: {"size": size, "seed": seed},
        st.sampled_from(BIG_SIZES),
        st.integers(0, 255),
    ),
)
EMPTY: dict[str, Any] = {"literal": ""}
pieces = st.lists(st.sampled_from([1, 3, 100, 4096, 65536]), max_size=3).map(tuple)
pause = st.sampled_from([0.0, 0.0, 0.005, 0.02])

# -- what the upstream answers -----------------------------------------------------------

reason_text = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12
)
RESPONSE_NAMES = [
    "Set-Cookie",
    "Keep-Alive",
    "Trailer",
    "Upgrade",
    "Proxy-Authenticate",
    "Fence-Epoch",
    "Fence-Effect-Id",
    "Idempotent-Replayed",
    "Content-Type",
    "ETag",
    "Location",
    "X-Wire-A",
    "x-wire-a",
    "Server",
    "Date",
]


# Answer header lines longer than 8 KiB are ordinary (a Content-Security-Policy, a
# Set-Cookie); up to 64 KiB a line passes (docs/reference/wire.md). A spec for the
# recording upstream's `header_text`.
LONG_VALUE_SIZES = [8191, 8192, 8193, 20_000, 65_000]
long_value = st.builds(
    lambda size, seed: {"size": size, "seed": seed},
    st.sampled_from(LONG_VALUE_SIZES),
    st.integers(0, 93),
)


@st.composite
def upstream_headers(draw: st.DrawFn) -> list[list[Any]]:
    headers: list[list[Any]] = []
    for _ in range(draw(st.integers(0, 6))):
        name = draw(
            st.one_of(st.sampled_from(RESPONSE_NAMES), st.from_regex(r"\AX-[A-Za-z0-9-]{1,10}\Z"))
        )
        if name == "Idempotent-Replayed":
            value: Any = "true"
        elif draw(st.integers(0, 5)) == 0:
            value = draw(long_value)
        else:
            value = draw(header_value_text)
        headers.append([name, value])
    if draw(st.booleans()) and headers:
        nominated = draw(st.lists(st.sampled_from([h[0] for h in headers]), min_size=1, max_size=2))
        headers.append(["Connection", ", ".join(nominated)])
    return headers


def script(
    status: int = 200,
    reason: str = "OK",
    headers: list[list[Any]] | None = None,
    body: dict[str, Any] | None = None,
    framing: str = "length",
    misbehave: str | None = None,
    cut_at: int = 0,
    pieces: tuple[int, ...] = (),
    pause_s: float = 0.0,
) -> dict[str, Any]:
    """A recording upstream script (tests/wire/recording_upstream.py, `Script`)."""
    return {
        "status": status,
        "reason": reason,
        "headers": headers or [],
        "body": body or EMPTY,
        "framing": framing,
        "pieces": list(pieces),
        "pause_s": pause_s,
        "misbehave": misbehave,
        "cut_at": cut_at,
    }


@st.composite
def upstream_script(
    draw: st.DrawFn, statuses: list[int], misbehaviours: tuple[str | None, ...] = (None,)
) -> dict[str, Any]:
    return script(
        status=draw(st.sampled_from(statuses)),
        reason=draw(reason_text),
        headers=draw(upstream_headers()),
        body=draw(body_spec),
        framing=draw(st.sampled_from(["length", "chunked", "close"])),
        misbehave=draw(st.sampled_from(misbehaviours)),
        cut_at=draw(st.integers(0, 300)),
        pieces=draw(pieces),
        pause_s=draw(pause),
    )


# -- one example: what the worker sends and what the upstream answers ----------------------


@dataclass(frozen=True)
class Case:
    method: str
    path: str  # after the route's prefix, with the query: "a/b?c"
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: dict[str, Any] = field(default_factory=lambda: EMPTY)  # a body spec
    framing: str = "none"  # "none" (no framing header), "length" or "chunked"
    script: dict[str, Any] = field(default_factory=script)
    keyed: bool = False  # a fenced write with an Idempotency-Key (then replayed)
    pieces: tuple[int, ...] = ()
    pause_s: float = 0.0


@st.composite
def cases(
    draw: st.DrawFn,
    methods: list[str],
    statuses: list[int],
    misbehaviours: tuple[str | None, ...] = (None,),
    allow_invalid: bool = True,
) -> Case:
    body = draw(body_spec) if draw(st.integers(0, 2)) else EMPTY
    has_body = body != EMPTY
    return Case(
        method=draw(st.sampled_from(methods)),
        path=draw(path_rest) + draw(query),
        headers=draw(worker_headers(allow_invalid)),
        body=body,
        framing=draw(st.sampled_from(["length", "chunked"] if has_body else FRAMINGS)),
        script=draw(upstream_script(statuses, misbehaviours)),
        keyed=draw(st.booleans()),
        pieces=draw(pieces),
        pause_s=draw(pause),
    )


FRAMINGS = ["none", "length", "chunked"]

# -- the exchange ------------------------------------------------------------------------


def send(
    wire: WireStack,
    case: Case,
    target: str,
    token: str,
    proxy_headers: list[tuple[bytes, bytes]],
) -> tuple[WorkerRequest, WorkerAnswer]:
    credential = f"Bearer {wire.admin_token}".encode()
    all_headers = (
        (b"Host", f"127.0.0.1:{wire.proxy_port}".encode()),
        (b"Wire-Script", token.encode()),
        *proxy_headers,
        *((n, credential if v == ADMIN_CREDENTIAL else v) for n, v in case.headers),
    )
    request = WorkerRequest(
        case.method,
        target.encode(),
        all_headers,
        body_bytes(case.body),
        case.framing,
        case.pieces,
        case.pause_s,
    )
    note(f"worker sends {request.wire_bytes()[:2000]!r}")
    answer = exchange(wire.proxy_port, request)
    note(f"worker got {answer.status} {answer.reason!r} {answer.headers!r} {answer.body[:300]!r}")
    if answer.malformed:
        settle([contract.Violation("response_framing", "the worker's answer breaks its framing")])
    return request, answer


def problem_code(answer: WorkerAnswer) -> str | None:
    if not any(v.startswith(b"application/problem+json") for v in answer.header("Content-Type")):
        return None
    try:
        code: str = json.loads(answer.body)["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code


# The refusal of a request that repeats a singleton field: aiohttp's parser answers
# 400 before any handler runs, so no code of the proxy's is expected.
SINGLETON_REPEATED = "singleton_repeated"
REFUSAL_STATUS = {"invalid_request": 400, "payload_too_large": 413}


def expected_refusals(request: WorkerRequest) -> list[tuple[str, str]]:
    """The refusals the contract asks for, as (the rule, the proxy's code): when several
    apply, any of them is right, except that the parser's comes before all others."""
    headers = contract.lower(request.headers)
    if contract.repeats_a_singleton(headers):
        return [("singleton_refused", SINGLETON_REPEATED)]
    refusals = []
    path = unquote(request.target.partition(b"?")[0].decode())
    if path.startswith("/f/") and any(s in ("", ".", "..") for s in path.split("/")[1:]):
        refusals.append(("dot_segments_refused", "invalid_request"))  # one object, one resource
    if path.startswith("/f/") and "\x00" in path:
        refusals.append(("nul_refused", "invalid_request"))  # no store could record it
    for _, value in request.headers:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            refusals.append(("invalid_utf8_refused", "invalid_request"))
            break
    if contract.nominates_meaningful(headers):
        refusals.append(("meaningful_connection_refused", "invalid_request"))
    if len(request.body) > MAX_BODY_BYTES:
        refusals.append(("body_too_large_refused", "payload_too_large"))
    return refusals


def check_refusal_or_forwarded(
    wire: WireStack, request: WorkerRequest, answer: WorkerAnswer, token: str
) -> dict[str, Any] | None:
    """Check that a request the contract refuses was refused with nothing forwarded; the
    upstream's record of one it forwards."""
    received = wire.received(token)
    refusals = expected_refusals(request)
    if not refusals:
        assert len(received) == 1, f"the upstream got {len(received)} requests for one ({answer})"
        return received[0]
    rule, code = refusals[0]
    codes = {code for _, code in refusals}
    violations = []
    if code == SINGLETON_REPEATED:
        if answer.status != 400:
            violations.append(contract.Violation(rule, f"got {answer.status}"))
        if request.method == "HEAD":  # no body: its type says what it would have been
            content_types = answer.header("Content-Type")
            problem = any(v.startswith(b"application/problem+json") for v in content_types)
        else:
            problem = problem_code(answer) is not None
        if not problem:
            violations.append(
                contract.Violation("refusal_problem_json", "a plain-text 400 from the parser")
            )
    elif request.method == "HEAD":  # the problem's body is not sent: its status is
        if answer.status not in {REFUSAL_STATUS[c] for c in codes}:
            violations.append(contract.Violation(rule, f"expected one of {sorted(codes)}"))
    elif problem_code(answer) not in codes:
        violations.append(contract.Violation(rule, f"expected one of {sorted(codes)}"))
    if received:
        violations.append(contract.Violation(rule, "a refused request reached upstream"))
    settle(violations)
    return None


def check_request(
    wire: WireStack,
    request: WorkerRequest,
    received: dict[str, Any],
    fence: dict[bytes, bytes] | None,
) -> list[contract.Violation]:
    return contract.check_upstream_request(
        method=request.method,
        target=request.target,
        worker_headers=request.headers,
        body=request.body,
        worker_framed=request.framing != "none",
        received=received,
        fence=fence,
        authority=wire.authority,
        credentials=frozenset({wire.admin_token.encode()}),
    )


def check_answer(
    case: Case, answer: WorkerAnswer, own: dict[bytes, bytes | None]
) -> list[contract.Violation]:
    answered = case.script
    return contract.check_worker_answer(
        status=answered["status"],
        reason=answered["reason"].encode(),
        upstream_headers=[(n.encode(), header_text(v).encode()) for n, v in answered["headers"]],
        body=b"" if case.method == "HEAD" else body_bytes(answered["body"]),
        answer_status=answer.status,
        answer_reason=answer.reason,
        answer_headers=answer.headers,
        answer_body=answer.body,
        answer_complete=answer.complete,
        own=own,
    )


# -- rules 1 and 2: pass-through routes ----------------------------------------------------

PASS_THROUGH_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@wire_settings
@given(case=cases(PASS_THROUGH_METHODS, [200, 201, 203, 299, 400, 404, 418, 500, 503]))
@example(case=Case("GET", "A"))  # request_framing (Content-Length: 0), request_no_additions
@example(case=Case("GET", "A?"))  # request_target: the empty query is dropped
@example(case=Case("GET", "A", headers=((b"Fence-Custom", b"x"),)))  # request_fence_headers
@example(case=Case("GET", "A", headers=((b"X-A", b"x\xff"),)))  # invalid_utf8_refused
@example(case=Case("GET", "A", headers=((b"User-Agent", b""), (b"User-Agent", b"x"))))
# request_headers: one header twice, its name in two cases: the upstream gets only the last
@example(case=Case("GET", "A", headers=((b"X-Wire-A", b"a"), (b"x-wire-a", b"b"))))
@example(case=Case("GET", "A", headers=((b"Authorization", ADMIN_CREDENTIAL),)))
@example(case=Case("GET", "A", script=script(headers=[["Fence-Epoch", "1"]])))
@example(case=Case("GET", "a%0Ab"))  # an encoded newline: the router's 404 not_found
@example(case=Case("GET", "A", script=script(headers=[["Set-Cookie", {"size": 9000, "seed": 1}]])))
def test_pass_through_forwards_both_ways_exactly(wire: WireStack, case: Case) -> None:
    token = wire.new_token()
    wire.script(token, case.script)
    request, answer = send(wire, case, "/p/" + case.path, token, [])
    received = check_refusal_or_forwarded(wire, request, answer, token)
    if received is None:
        return
    settle(check_request(wire, request, received, None) + check_answer(case, answer, {}))


# -- rules 1, 2 and 3: fenced routes and their replays ------------------------------------

FENCED_METHODS = ["POST", "PUT", "PATCH", "DELETE"]


@wire_settings
@given(case=cases(FENCED_METHODS, [200, 201, 202, 203, 299, 400, 404, 409, 422]))
# bug 1: a body in two pieces reaches the worker as its first piece
@example(
    case=Case(
        "POST", "x", script=script(body={"size": 65537, "seed": 0}, pieces=(100,), pause_s=0.02)
    )
)
@example(
    case=Case(
        "POST", "x", script=script(body={"literal": "YWJjZGVm"}, framing="chunked", pieces=(1,))
    )
)
# bug 3: the upstream's own Idempotent-Replayed reaches the worker on a first answer
@example(case=Case("POST", "x", script=script(headers=[["Idempotent-Replayed", "true"]])))
@example(case=Case("PUT", "x", script=script(reason="Fine")))  # response_reason
# answer_too_large: an answer over 16 MiB after the write reaches the worker cut
@example(case=Case("POST", "x", script=script(body={"size": 16 * 1_048_576 + 1, "seed": 1})))
# replay_identical: a replay keeps only some of the first answer's headers
@example(case=Case("POST", "x", keyed=True, script=script(headers=[["X-A", "a"]])))
@example(case=Case("POST", "a%0Ab"))  # an encoded newline: the router's 404 not_found
# a header line over 8 KiB: 504 outcome_unknown, the committed write's effect UNKNOWN
@example(
    case=Case(
        "POST",
        "x",
        keyed=True,
        script=script(headers=[["Content-Security-Policy", {"size": 9000, "seed": 2}]]),
    )
)
def test_fenced_forwards_both_ways_exactly_and_replays_the_same(
    wire: WireStack, case: Case
) -> None:
    rid = wire.new_token()
    fence_token, epoch = wire.acquire(f"wire:{rid}")
    token = wire.new_token()
    wire.script(token, case.script)
    proxy_headers = [(b"Fence-Token", fence_token.encode())]
    if case.keyed:
        proxy_headers.append((b"Idempotency-Key", f"key-{token}".encode()))
    target = f"/f/{rid}/{case.path}"
    request, first = send(wire, case, target, token, proxy_headers)
    received = check_refusal_or_forwarded(wire, request, first, token)
    if received is None:
        return
    resource = f"wire:{rid}".encode()
    fence = {b"fence-epoch": str(epoch).encode(), b"fence-resource": resource}
    own: dict[bytes, bytes | None] = {**fence, b"fence-effect-id": None}
    violations = check_request(wire, request, received, {**fence, b"fence-effect-id": b""})
    if len(body_bytes(case.script["body"])) > UPSTREAM_BODY_LIMIT:
        settle(violations + answer_over_the_limit(wire, case, first))
        return
    violations += check_answer(case, first, own)
    if case.keyed and 200 <= case.script["status"] < 300:
        _, replay = send(wire, case, target, token, proxy_headers)
        assert len(wire.received(token)) == 1, "a replay reached the upstream"
        violations += contract.check_replay(
            first_status=first.status,
            first_reason=first.reason,
            first_headers=first.headers,
            first_body=first.body,
            replay_status=replay.status,
            replay_reason=replay.reason,
            replay_headers=replay.headers,
            replay_body=replay.body,
        )
    settle(violations)


UPSTREAM_BODY_LIMIT = 16 * 1_048_576


def answer_over_the_limit(
    wire: WireStack, case: Case, answer: WorkerAnswer
) -> list[contract.Violation]:
    """A fenced answer over 16 MiB: the write happened (for a committed status), so the
    worker is told so (502 upstream_answer_too_large) or that the outcome is unknown
    (504 outcome_unknown); never the answer cut, never "nothing happened"."""
    code = problem_code(answer)
    if code not in ("upstream_answer_too_large", "outcome_unknown"):
        return [
            contract.Violation(
                "answer_too_large",
                f"the upstream answered {len(body_bytes(case.script['body']))} bytes; the "
                f"worker got {answer.status} {code} with {len(answer.body)} bytes",
            )
        ]
    effect_id = json.loads(answer.body)["effect_id"]
    state = wire.admin("GET", f"/_fence/v1/effects/{effect_id}")["state"]
    if code == "upstream_answer_too_large" and state != "COMMITTED":
        return [contract.Violation("answer_too_large", f"told applied, the effect is {state}")]
    return []


# -- rule 4: every accepted key's probe path decodes back to it ----------------------------

key_text = st.one_of(
    st.sampled_from([".", "..", "...", ".a", "a.", "~", "%2e", "%2E%2E", "a/b", "@:", "a%"]),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12),
    st.text(st.sampled_from(sorted(contract.IDEMPOTENCY_KEY_ALPHABET)), min_size=1, max_size=12),
)


@wire_settings
@given(key=key_text)
@example(key=".")  # bug 2: the probe asks for /probe/ and settles the effect NOT_COMMITTED
@example(key="..")  # bug 2: the probe asks for /
@example(key="a%")  # key_alphabet: outside the contract's alphabet, yet accepted
def test_probe_path_decodes_back_to_the_key(wire: WireStack, key: str) -> None:
    rid = wire.new_token()
    fence_token, _ = wire.acquire(f"key:{rid}")
    token = wire.new_token()
    wire.script(token, script(misbehave="close_before_answer"))
    case = Case("POST", "", body={"literal": base64.b64encode(b"{}").decode()}, framing="length")
    proxy_headers = [(b"Fence-Token", fence_token.encode()), (b"Idempotency-Key", key.encode())]
    _, answer = send(wire, case, f"/k/{rid}", token, proxy_headers)
    accepted = answer.status != 400 or problem_code(answer) != "invalid_request"
    violations: list[contract.Violation] = []
    if accepted != contract.key_accepted(key):
        verdict = "accepted" if accepted else "refused"
        violations.append(
            contract.Violation("key_alphabet", f"key {key!r}: the proxy {verdict} it")
        )
    if not accepted:
        assert not wire.received(token), "a refused key reached the upstream"
        settle(violations)
        return
    assert problem_code(answer) == "outcome_unknown", answer
    effect_id = json.loads(answer.body)["effect_id"]
    # The reconciler may have probed first (409 effect_settled): its probe is logged too.
    wire.admin("POST", f"/_fence/v1/effects/{effect_id}/probe", {}, accept=(200, 409))
    probes: list[dict[str, Any]] = []

    def probed() -> bool:
        probes[:] = wire.probes_of(effect_id)
        return bool(probes)

    wait_for(f"the probe of {effect_id}", probed, 10.0)
    path = probes[0]["target"].partition(b"?")[0]
    prefix = b"/probe/"
    decoded = unquote_to_bytes(path.removeprefix(prefix)) if path.startswith(prefix) else None
    if decoded != key.encode():
        violations.append(
            contract.Violation(
                "probe_path_decodes", f"key {key!r}: the upstream was asked {path!r}"
            )
        )
    state = wire.admin("GET", f"/_fence/v1/effects/{effect_id}")["state"]
    if state in ("NOT_COMMITTED", "NOT_SENT"):
        violations.append(
            contract.Violation(
                "truthful_failure",
                f"key {key!r}: the upstream logged the whole request, the effect says {state}",
            )
        )
    settle(violations)


# -- rule 5: a misbehaving upstream is never contradicted -----------------------------------

MISBEHAVIOURS = ("cut", "close_before_answer", "junk", "close_mid_request")


@wire_settings
@given(
    case=cases(["GET", "POST"], [200, 201, 404], MISBEHAVIOURS, allow_invalid=False),
    fenced=st.booleans(),
)
# pass-through: the upstream took the whole request and closed: "upstream_unreachable"
@example(case=Case("GET", "x", script=script(misbehave="close_before_answer")), fenced=False)
# pass-through: a cut mid-body becomes a second response inside the chunked body
@example(
    case=Case("GET", "x", script=script(body={"literal": "AA=="}, misbehave="cut")), fenced=False
)
def test_a_misbehaving_upstream_is_never_contradicted(
    wire: WireStack, case: Case, fenced: bool
) -> None:
    token = wire.new_token()
    wire.script(token, case.script)
    if fenced:
        rid = wire.new_token()
        fence_token, _ = wire.acquire(f"wire:{rid}")
        case = replace(case, method="POST")
        target, proxy_headers = f"/f/{rid}/x", [(b"Fence-Token", fence_token.encode())]
    else:
        target, proxy_headers = "/p/x", []
    case = replace(case, headers=())
    _, answer = send(wire, case, target, token, proxy_headers)
    received = wire.received(token)
    assert received, "the upstream logged nothing"
    complete_request = received[0]["complete"]
    answered = case.script
    upstream_body = body_bytes(answered["body"])
    violations: list[contract.Violation] = []
    code = problem_code(answer)
    if code == "upstream_unreachable":
        violations.append(
            contract.Violation(
                "truthful_failure",
                f"told upstream_unreachable, but the upstream logged the request "
                f"({'whole' if complete_request else 'in part'})",
            )
        )
    # A cut of a close-delimited body looks whole to anyone, the upstream included.
    misbehave = answered["misbehave"]
    cut_short = (
        misbehave == "cut"
        and answered["framing"] != "close"
        and (answered["framing"] == "chunked" or bool(upstream_body))
    )
    told_whole = answer.complete and answer.status == answered["status"] and code is None
    if (misbehave != "cut" or cut_short) and told_whole:
        violations.append(
            contract.Violation(
                "truthful_failure",
                f"upstream {misbehave} ({len(upstream_body)} body bytes, framing "
                f"{answered['framing']}); the worker got a complete {answer.status} "
                f"with {len(answer.body)} bytes",
            )
        )
    if fenced and code is not None and "effect_id" in json.loads(answer.body):
        effect_id = json.loads(answer.body)["effect_id"]
        state = wire.admin("GET", f"/_fence/v1/effects/{effect_id}")["state"]
        if complete_request and state in ("NOT_COMMITTED", "NOT_SENT"):
            violations.append(
                contract.Violation(
                    "truthful_failure", f"the upstream logged the whole request; effect {state}"
                )
            )
    settle(violations)


# A property runs all its examples in one test: WIRE_TIMEOUT_S bounds it (0: no bound,
# for `make fuzz-http`).
pytestmark = pytest.mark.timeout(float(os.environ.get("WIRE_TIMEOUT_S", "900")))
