"""The request-head counter: refuses a head over the limits as its bytes arrive, and
tells head bytes from body bytes across pipelined requests."""

from __future__ import annotations

import pytest

from core.codes import ErrorCode
from core.request_heads import HeadCounter, HeadLimits

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
