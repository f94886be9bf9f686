"""The request-head counter: refuses a head over the limits as its bytes arrive, and
tells head bytes from body bytes across pipelined requests."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.codes import ErrorCode
from core.request_heads import ONCE_ONLY_FIELDS, HeadCounter, HeadLimits

LIMITS = HeadLimits(request_line=100, header_lines=4, header_bytes=200)
HEAD = b"POST /orders HTTP/1.1\r\nHost: p\r\n"


def fed(*pieces: bytes, limits: HeadLimits = LIMITS) -> tuple[HeadCounter, ErrorCode | None]:
    counter = HeadCounter(limits)
    verdict = None
    for piece in pieces:
        verdict = counter.feed(piece)
    return counter, verdict


def test_a_small_request_passes_and_completes_one_head() -> None:
    counter, verdict = fed(b"GET / HTTP/1.1\r\nHost: p\r\n\r\n")
    assert verdict is None
    assert counter.heads_completed == 1


def test_an_unfinished_header_block_is_refused_as_it_grows_past_the_limit() -> None:
    counter = HeadCounter(LIMITS)
    assert counter.feed(HEAD) is None
    assert counter.feed(b"X-Pad: " + b"a" * 180) is None
    # No line end has arrived: the line being received counts already.
    assert counter.feed(b"a" * 20) == ErrorCode.HEADERS_TOO_LARGE
    assert counter.feed(b"\r\n\r\n") == ErrorCode.HEADERS_TOO_LARGE


def test_too_many_header_lines_are_refused() -> None:
    _, verdict = fed(HEAD + b"a: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\n")
    assert verdict == ErrorCode.HEADERS_TOO_LARGE


def test_a_long_request_line_is_uri_too_long_even_without_its_line_end() -> None:
    _, verdict = fed(b"GET /" + b"a" * 60, b"b" * 60)
    assert verdict == ErrorCode.URI_TOO_LONG


def test_the_limits_are_per_request_head_not_per_connection() -> None:
    head = HEAD + b"X-Pad: " + b"a" * 100 + b"\r\n\r\n"
    counter, verdict = fed(head, head, head)
    assert verdict is None
    assert counter.heads_completed == 3


@pytest.mark.parametrize("split", [1, 7, 64])
def test_a_content_length_body_is_not_counted_and_the_next_head_is(split: int) -> None:
    body = b"x\r\n" * 500
    first = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    second = b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * 250
    counter = HeadCounter(LIMITS)
    for stream, expected in ((first, None), (second, ErrorCode.HEADERS_TOO_LARGE)):
        verdicts = {counter.feed(stream[i : i + split]) for i in range(0, len(stream), split)}
        assert expected in verdicts
        assert counter.heads_completed == 1


def test_a_chunked_body_of_many_chunks_passes_and_its_trailers_count_as_headers() -> None:
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (3, b"abc") for _ in range(1000))
    body_then_trailers = chunks + b"0\r\nTrailer: t\r\n\r\n"
    counter, verdict = fed(
        HEAD
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + body_then_trailers
        + b"GET / HTTP/1.1\r\n\r\n"
    )
    assert verdict is None
    assert counter.heads_completed == 2
    _, verdict = fed(
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"0\r\nT: " + b"a" * 300 + b"\r\n"
    )
    assert verdict == ErrorCode.HEADERS_TOO_LARGE


def test_a_chunked_body_followed_by_a_pipelined_head_counts_that_head() -> None:
    _, verdict = fed(
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: " + b"a" * 300,
    )
    assert verdict == ErrorCode.HEADERS_TOO_LARGE


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: +5000\r\n",
        b"Transfer-Encoding: gzip\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5000\r\n",
    ],
)
def test_framing_no_parser_accepts_counts_what_follows_as_head(framing: bytes) -> None:
    _, verdict = fed(HEAD + framing + b"\r\n" + b"x" * 250)
    assert verdict == ErrorCode.HEADERS_TOO_LARGE


def test_a_chunk_size_that_is_not_hexadecimal_counts_what_follows_as_head() -> None:
    _, verdict = fed(HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + b"x" * 250)
    assert verdict == ErrorCode.HEADERS_TOO_LARGE


def test_empty_lines_before_a_request_line_start_no_head() -> None:
    counter, verdict = fed(b"\r\n\r\n\r\n")
    assert verdict is None
    assert counter.heads_completed == 0


@pytest.mark.parametrize(
    "framing",
    [b"Content-Length: 5" + b" " * 300, b"Transfer-Encoding: chunked" + b" " * 300],
)
def test_a_framing_line_too_long_to_read_counts_what_follows_as_head(framing: bytes) -> None:
    limits = HeadLimits(request_line=100, header_lines=4, header_bytes=400)
    stream = HEAD + framing + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n"
    for pieces in ([stream], [stream[i : i + 1] for i in range(len(stream))]):
        counter, verdict = fed(*pieces, limits=limits)
        assert verdict is None
        assert counter.heads_completed == 1


TOO_LARGE = ErrorCode.HEADERS_TOO_LARGE
TOO_LONG = ErrorCode.URI_TOO_LONG
# Each stream with its verdict and the heads it completes, under LIMITS (a request line
# of 100 bytes with its CR, 4 header lines, 200 bytes of header block with its line ends
# and the blank line).
STREAMS: list[tuple[bytes, ErrorCode | None, int]] = [
    (b"GET / HTTP/1.1\r\nHost: p\r\n\r\n", None, 1),
    (HEAD + b"Content-Length: 5\r\n\r\nhello" + b"GET / HTTP/1.1\r\nHost: p\r\n\r\n", None, 2),
    (HEAD + b"content-length:  3 \r\n\r\nabc" + b"GET /" + b"a" * 120, TOO_LONG, 1),
    (
        HEAD + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello" + b"x" * 250,
        ErrorCode.INVALID_REQUEST,
        0,
    ),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", None, 1),
    (HEAD + b"X-Folded: a\r\n b\r\n\r\n", None, 1),
    (HEAD + b"X: " + b"a" * 170 + b"\r\n\r\n", None, 1),
    (HEAD + b"X: " + b"a" * 184 + b"\r\n\r\n", None, 1),  # a header block of exactly 200
    (HEAD + b"X: " + b"a" * 185 + b"\r\n\r\n", TOO_LARGE, 0),
    (HEAD + b"X: " + b"a" * 186 + b"\r\n\r\n", TOO_LARGE, 0),
    (HEAD + b"a: 1\r\nb: 2\r\nc: 3\r\n\r\n", None, 1),  # 4 header lines
    (HEAD + b"a: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\n\r\n", TOO_LARGE, 0),
    (b"GET /" + b"a" * 85 + b" HTTP/1.1\r\n\r\n", None, 1),  # a request line of exactly 100
    (b"GET /" + b"a" * 86 + b" HTTP/1.1\r\n\r\n", TOO_LONG, 0),
    (b"GET /" + b"a" * 87 + b" HTTP/1.1\r\n\r\n", TOO_LONG, 0),
    (b"\r\nGET / HTTP/1.1\r\n\r\n", None, 1),
    (b"GET / HTTP/1.1\nHost: p\n\n", None, 1),
    # After framing no parser accepts, what follows counts as one head's bytes: 200 pass.
    (HEAD + b"Content-Length: x\r\n\r\n" + b"y" * 200, None, 1),
    (HEAD + b"Content-Length: x\r\n\r\n" + b"y" * 201, TOO_LARGE, 1),
]


@pytest.mark.parametrize(("stream", "verdict", "heads"), STREAMS)
def test_a_head_that_arrives_whole_is_judged_as_one_that_arrives_byte_by_byte(
    stream: bytes, verdict: ErrorCode | None, heads: int
) -> None:
    whole, whole_verdict = fed(stream)
    pieces, pieces_verdict = fed(*(stream[i : i + 1] for i in range(len(stream))))
    assert whole_verdict == pieces_verdict == verdict
    assert whole.heads_completed == pieces.heads_completed == heads


REPEATED_USER_AGENT = (
    b"GET /p HTTP/1.1\r\nHost: h\r\nUser-Agent: a\r\nX-A: 1\r\nuser-agent: b\r\n\r\n"
)


@pytest.mark.parametrize(
    "pieces", [[REPEATED_USER_AGENT], [bytes([b]) for b in REPEATED_USER_AGENT]]
)
def test_a_repeated_once_only_field_is_refused_however_it_arrives(pieces: list[bytes]) -> None:
    counter = HeadCounter(LIMITS)
    refusals = [counter.feed(piece) for piece in pieces]
    assert refusals[-1] is ErrorCode.INVALID_REQUEST


def test_a_repeated_once_only_field_on_a_long_line_is_refused() -> None:
    counter = HeadCounter(HeadLimits(request_line=100, header_lines=4, header_bytes=4000))
    long_value = b"x" * 1000
    head = b"GET /p HTTP/1.1\r\nUser-Agent: " + long_value + b"\r\nUser-Agent: b\r\n\r\n"
    assert counter.feed(head) is ErrorCode.INVALID_REQUEST


def test_other_repeated_fields_pass() -> None:
    counter = HeadCounter(HeadLimits(request_line=100, header_lines=10, header_bytes=400))
    head = b"GET /p HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\nAccept: a\r\nAccept: b\r\n\r\n"
    assert counter.feed(head) is None
    assert counter.heads_completed == 1


def test_two_content_lengths_are_refused_as_a_repeated_field() -> None:
    _, verdict = fed(HEAD + b"Content-Length: 5000\r\nContent-Length: 5000\r\n\r\n")
    assert verdict == ErrorCode.INVALID_REQUEST


# -- the fast path against the line-by-line count ------------------------------------
#
# A head that arrives whole takes `_whole_head`, one scan of it; fed a byte at a time,
# every head takes the line-by-line count (no single byte holds a head's end), which
# reads each line as it ends: the reference. Both must agree on any stream: its
# verdict, the heads it completes, and the method the refusal answers.

ONCE_ONLY_NAMES = sorted(name.decode() for name in ONCE_ONLY_FIELDS)
line_end = st.sampled_from(["\r\n"] * 8 + ["\n", "\r\r\n"])


@st.composite
def spelled(draw: st.DrawFn, name: str) -> str:
    """`name` in any case."""
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.upper() if flip else c for c, flip in zip(name, flips, strict=True))


blank = st.text(alphabet=" \t", max_size=3) | st.sampled_from([" " * 120, "\t" * 250])
header_name = st.one_of(
    st.sampled_from(ONCE_ONLY_NAMES).flatmap(spelled),
    st.sampled_from(["Content-Lengthy", "Transfer-Encodingx", "X-A", "Accept"]).flatmap(spelled),
)
header_value = st.one_of(
    st.integers(0, 40).map(str),
    st.sampled_from(["chunked", "gzip, chunked", "abc", "5x", "+5", "0x1f", ""]),
    st.text(alphabet="ab:\r", max_size=8),
    st.integers(240, 300).map(lambda n: "v" * n),  # past the kept start of a line
)


@st.composite
def header_line(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["field"] * 6 + ["folded", "no colon", "crs"]))
    if kind == "folded":
        return draw(st.sampled_from([" ", "\t"])) + draw(header_value) + draw(line_end)
    if kind == "no colon":
        return draw(header_name) + draw(line_end)
    if kind == "crs":
        return "\r" * draw(st.integers(1, 2)) + draw(line_end)
    before_colon = draw(st.sampled_from(["", "", "", " "]))
    value = draw(blank) + draw(header_value) + draw(blank)
    return draw(header_name) + before_colon + ":" + value + draw(line_end)


@st.composite
def request(draw: st.DrawFn) -> bytes:
    empty_lines = "".join(draw(st.lists(st.sampled_from(["\r\n", "\n"]), max_size=2)))
    method = draw(st.sampled_from(["GET", "HEAD", "POST", "put"]))
    target = "/" + "t" * draw(st.integers(0, 40))
    lines = "".join(draw(st.lists(header_line(), max_size=8)))
    head = f"{empty_lines}{method} {target} HTTP/1.1{draw(line_end)}{lines}{draw(line_end)}"
    body = "b" * draw(st.integers(0, 45))
    return (head + body).encode("latin-1")


GENEROUS = HeadLimits(request_line=80, header_lines=12, header_bytes=2000)
limits = st.one_of(
    st.just(GENEROUS),
    st.builds(
        HeadLimits,
        request_line=st.integers(15, 80),
        header_lines=st.integers(1, 10),
        header_bytes=st.integers(20, 1200),
    ),
)
LAST = b"HEAD /last HTTP/1.1\r\nHost: h\r\n\r\n"


def _outcome(counter: HeadCounter, verdict: ErrorCode | None) -> tuple[object, ...]:
    return verdict, counter.heads_completed, counter.method


@settings(max_examples=500, deadline=None)
@given(requests=st.lists(request(), min_size=1, max_size=3), limits=limits, cuts=st.data())
@example(  # a line of CRs ends a head
    requests=[b"GET / HTTP/1.1\r\nHost: h\r\n\r\r\nX-A: 1\r\n\r\n"], limits=GENEROUS, cuts=None
)
@example(requests=[b"\r\r\nGET / HTTP/1.1\r\n\r\n"], limits=GENEROUS, cuts=None)
@example(  # a folded line may continue Content-Length
    requests=[b"POST / HTTP/1.1\r\nContent-Length: 5\r\n 6\r\n\r\nbbbbb"],
    limits=GENEROUS,
    cuts=None,
)
@example(  # a long line whose name starts with content-length leaves the framing unclear
    requests=[b"POST / HTTP/1.1\r\nContent-Lengthy: " + b"v" * 250 + b"\r\n\r\nbbbbb"],
    limits=GENEROUS,
    cuts=None,
)
@example(
    requests=[b"POST / HTTP/1.1\r\nContent-Length: 5" + b" " * 250 + b"\r\n\r\nbbbbb"],
    limits=GENEROUS,
    cuts=None,
)
def test_the_fast_path_agrees_with_the_line_by_line_count(
    requests: list[bytes], limits: HeadLimits, cuts: st.DataObject | None
) -> None:
    """Request after request, each whole or cut anywhere (`cuts`), then a last one."""
    fast = HeadCounter(limits)
    slow = HeadCounter(limits)
    for stream in [*requests, LAST]:
        at = sorted(cuts.draw(st.lists(st.integers(0, len(stream)), max_size=2))) if cuts else []
        bounds = [0, *at, len(stream)]
        fast_verdict = slow_verdict = None
        for a, b in itertools.pairwise(bounds):
            fast_verdict = fast.feed(stream[a:b])
        for i in range(len(stream)):
            slow_verdict = slow.feed(stream[i : i + 1])
        assert _outcome(fast, fast_verdict) == _outcome(slow, slow_verdict), stream
