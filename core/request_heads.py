"""Counting a connection's request heads as their bytes arrive, before any parser keeps them.

aiohttp's parser keeps every header of a request head until the head is complete, up
to its own limits (256 headers of 64 KiB each: 16 MiB per connection). `HeadCounter`
sees the same bytes first and says when the head being sent is already over the
proxy's own limits, so the connection can be answered and closed while the proxy
holds a few KiB of it, not megabytes.

It follows HTTP/1.1 message framing (RFC 9112 §6) just far enough to tell head bytes
from body bytes: a body of `Content-Length` bytes, or a chunked body (whose size
lines are counted like a line of a head, and whose trailers like headers). Pipelined
requests are counted one after another. Where the framing is not what a parser would
accept (two Content-Length headers, a chunk size that is not hexadecimal), everything
that follows is counted as head bytes: the parser refuses such a request anyway, and
the counter never lets more than a head's worth through uncounted.
No I/O: the connection feeds it what it receives.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from core.codes import ErrorCode

# Fields a request may carry once (aiohttp's parser refuses a repeat with a text/plain
# 400): refused here first, as problem+json, before the parser sees the head.
ONCE_ONLY_FIELDS = frozenset(
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
# What the fast path must see of a whole head (lowered), in one scan: a line that
# starts with a ONCE_ONLY_FIELDS name and its colon gives the name and colon; every
# other mark is of a line the line-by-line count reads otherwise (_NOT_COMMON): a line
# after a bare LF (an empty match), a folded line (its space or tab), a line that
# starts with a CR (a line of CRs ends a head), and a line whose name starts with
# `transfer-encoding`, or with `content-length` and goes on (such a line, if longer
# than _KEPT_LINE, leaves the framing unclear). Every other line gives nothing.
# Counting the ten names apart was ten scans (bench/README.md).
_MARKS = re.compile(
    rb"\n((?<!\r\n)|[ \t\r]|transfer-encoding|content-length(?!:)|(?:"
    + b"|".join(re.escape(name) for name in sorted(ONCE_ONLY_FIELDS))
    + rb"):)"
)
_NOT_COMMON = frozenset({b"", b" ", b"\t", b"\r", b"transfer-encoding", b"content-length"})
# A Content-Length line the fast path reads: at most 100 bytes of blanks either side of
# at most 19 digits keeps the line within _KEPT_LINE; a longer one it leaves.
_CONTENT_LENGTH = re.compile(rb"\ncontent-length:[ \t]{0,100}([0-9]{1,19})[ \t]{0,100}\r")
# The part of a line the counter keeps to read it (a header's name and value, a chunk
# size): a longer line is counted but not read, and cannot be Content-Length,
# Transfer-Encoding or a chunk size that a parser accepts.
_KEPT_LINE = 256


@dataclass(frozen=True)
class HeadLimits:
    """Over `request_line` bytes the request line (its CR included) is `414 uri_too_long`; over
    `header_lines` header lines or `header_bytes` bytes of header block as sent (line
    ends and the blank line that ends it included) the head is `431 headers_too_large`."""

    request_line: int
    header_lines: int
    header_bytes: int


class _Part(enum.Enum):
    REQUEST_LINE = enum.auto()
    HEADERS = enum.auto()
    BODY = enum.auto()
    CHUNK_SIZE = enum.auto()
    CHUNK_DATA = enum.auto()
    CHUNK_END = enum.auto()
    TRAILERS = enum.auto()
    # After framing no parser accepts: every byte counts against one head's limits.
    UNFRAMED = enum.auto()


class HeadCounter:
    """One connection's counter: `feed` each piece received, in order."""

    def __init__(self, limits: HeadLimits) -> None:
        self._limits = limits
        self._part = _Part.REQUEST_LINE
        self._line = bytearray()  # the first _KEPT_LINE bytes of the line being received
        self._line_bytes = 0  # all bytes of that line so far, its line end excluded
        self._header_lines = 0
        self._header_bytes = 0  # the complete header lines, line ends included
        self._content_length: int | None = None
        self._chunked = False
        self._framing_unclear = False
        self._remaining = 0  # body or chunk bytes still to come
        self._once_seen: set[bytes] = set()  # the head's ONCE_ONLY_FIELDS so far
        self.heads_completed = 0
        self.refusal: ErrorCode | None = None
        # The method of the head being counted (None before the first): the answer to
        # a refused HEAD has no body.
        self.method: bytes | None = None

    def feed(self, data: bytes) -> ErrorCode | None:
        """The refusal for what arrived so far, or None while within the limits. Once
        refused, every later call answers the same."""
        if self.refusal is not None:
            return self.refusal
        position = 0
        end = len(data)
        while position < end and self.refusal is None:
            if self._part is _Part.REQUEST_LINE and not self._line_bytes:
                after = self._whole_head(data, position)
                if after >= 0:
                    position = after
                    continue
            if self._part is _Part.UNFRAMED:
                self._header_bytes += end - position
                position = end
                if self._header_bytes > self._limits.header_bytes:
                    self.refusal = ErrorCode.HEADERS_TOO_LARGE
                continue
            if self._part in (_Part.BODY, _Part.CHUNK_DATA):
                taken = min(self._remaining, end - position)
                self._remaining -= taken
                position += taken
                if self._remaining == 0:
                    chunk = self._part is _Part.CHUNK_DATA
                    self._part = _Part.CHUNK_END if chunk else _Part.REQUEST_LINE
                continue
            newline = data.find(b"\n", position)
            stop = end if newline < 0 else newline
            room = _KEPT_LINE - len(self._line)
            if room > 0:
                self._line += data[position : min(stop, position + room)]
            self._line_bytes += stop - position
            position = stop
            self._check_sizes()
            if newline >= 0 and self.refusal is None:
                position += 1
                self._end_line()
        return self.refusal

    def _whole_head(self, data: bytes, start: int) -> int:
        """For a common head that arrived whole (no Transfer-Encoding, at most one
        Content-Length, on a line of at most _KEPT_LINE bytes, every line ended by CRLF,
        none folded): where counting goes on, after the head and as much of its body as
        arrived with it. -1 for any other head, which the line-by-line count then takes."""
        limits = self._limits
        end = data.find(b"\r\n\r\n", start, start + limits.request_line + limits.header_bytes)
        if end < 0:
            return -1
        head = data[start : end + 2].lower()
        first_end = head.find(b"\r\n")
        header_bytes = end + 2 - start - first_end  # the blank line's CRLF included
        if (
            head.startswith(b"\r")  # an empty line, or one of CRs, before the request line
            or first_end + 1 > limits.request_line
            or header_bytes > limits.header_bytes
            # A header line takes 3 bytes at least: count them only when that could be over.
            or (
                header_bytes > 3 * limits.header_lines
                and head.count(b"\n") - 1 > limits.header_lines
            )
        ):
            return -1
        marks = _MARKS.findall(head)
        seen = set(marks)
        if not seen.isdisjoint(_NOT_COMMON):
            return -1
        self.method = data[start : start + first_end + 1].partition(b" ")[0]
        if len(seen) != len(marks):
            self.refusal = ErrorCode.INVALID_REQUEST
            return end + 4
        body_end = end + 4
        if b"content-length:" in seen:
            length = _CONTENT_LENGTH.search(head)
            if length is None:
                return -1
            body_end += int(length[1])
        self.heads_completed += 1
        if body_end <= len(data):
            return body_end
        self._remaining = body_end - len(data)
        self._part = _Part.BODY
        return len(data)

    def _check_sizes(self) -> None:
        limits = self._limits
        if self._part is _Part.REQUEST_LINE:
            if self._line_bytes > limits.request_line:
                self.refusal = ErrorCode.URI_TOO_LONG
        elif self._part in (_Part.HEADERS, _Part.TRAILERS):
            if self._header_bytes + self._line_bytes > limits.header_bytes:
                self.refusal = ErrorCode.HEADERS_TOO_LARGE
        elif self._line_bytes > limits.header_bytes:  # a chunk's size line, or its line end
            self.refusal = ErrorCode.HEADERS_TOO_LARGE

    def _end_line(self) -> None:
        kept = bytes(self._line)
        line = kept.rstrip(b"\r") if self._line_bytes <= _KEPT_LINE else None
        line_bytes = self._line_bytes + 1
        self._line.clear()
        self._line_bytes = 0
        part = self._part
        if part is _Part.REQUEST_LINE:
            # Empty lines before a request line are allowed (RFC 9112 §2.2) and kept by nothing.
            if line != b"":
                self.method = kept.partition(b" ")[0]
                self._start_head()
        elif part is _Part.HEADERS:
            if line == b"":
                if self._header_bytes + line_bytes > self._limits.header_bytes:
                    self.refusal = ErrorCode.HEADERS_TOO_LARGE
                else:
                    self._end_head()
            else:
                self._count_header_line(line_bytes)
                self._note_once_only(kept)
                if line is not None:
                    self._read_framing(line)
                elif _names_framing(kept):  # too long to read
                    self._framing_unclear = True
        elif part is _Part.CHUNK_SIZE:
            size = _chunk_size(line)
            if size is None:
                self._count_rest_as_head()
            elif size == 0:
                self._header_lines = 0
                self._header_bytes = 0
                self._part = _Part.TRAILERS
            else:
                self._remaining = size
                self._part = _Part.CHUNK_DATA
        elif part is _Part.CHUNK_END:
            if line == b"":
                self._part = _Part.CHUNK_SIZE
            else:
                self._count_rest_as_head()
        elif line == b"":  # TRAILERS
            self._part = _Part.REQUEST_LINE
        else:
            self._count_header_line(line_bytes)

    def _start_head(self) -> None:
        self._part = _Part.HEADERS
        self._header_lines = 0
        self._header_bytes = 0
        self._content_length = None
        self._chunked = False
        self._framing_unclear = False
        self._once_seen.clear()

    def _note_once_only(self, kept: bytes) -> None:
        """A field of ONCE_ONLY_FIELDS seen twice in one head is refused; its name is in
        the kept start of the line, however long the line is."""
        name, colon, _ = kept.partition(b":")
        name = name.lower()
        if not colon or name not in ONCE_ONLY_FIELDS:
            return
        if name in self._once_seen:
            self.refusal = ErrorCode.INVALID_REQUEST
        self._once_seen.add(name)

    def _count_header_line(self, line_bytes: int) -> None:
        self._header_lines += 1
        self._header_bytes += line_bytes
        if self._header_lines > self._limits.header_lines:
            self.refusal = ErrorCode.HEADERS_TOO_LARGE

    def _read_framing(self, line: bytes) -> None:
        if line[:1] in (b" ", b"\t"):
            # A folded line continues the header before it, which may be one of these.
            self._framing_unclear = self._framing_unclear or self._content_length is not None
            return
        name, colon, value = line.partition(b":")
        if not colon:
            return
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"content-length":
            if self._content_length is not None or not value.isdigit():
                self._framing_unclear = True
            else:
                self._content_length = int(value)
        elif name == b"transfer-encoding":
            self._chunked = value.lower().rsplit(b",", 1)[-1].strip(b" \t") == b"chunked"
            self._framing_unclear = self._framing_unclear or not self._chunked

    def _end_head(self) -> None:
        self.heads_completed += 1
        if self._framing_unclear or (self._chunked and self._content_length is not None):
            self._count_rest_as_head()
        elif self._chunked:
            self._part = _Part.CHUNK_SIZE
        elif self._content_length:
            self._remaining = self._content_length
            self._part = _Part.BODY
        else:
            self._part = _Part.REQUEST_LINE

    def _count_rest_as_head(self) -> None:
        self._part = _Part.UNFRAMED
        self._header_bytes = 0


def _names_framing(kept: bytes) -> bool:
    """Whether a header line's kept start names Content-Length or Transfer-Encoding."""
    return kept[:18].lower().startswith((b"content-length", b"transfer-encoding"))


def _chunk_size(line: bytes | None) -> int | None:
    if line is None:
        return None
    digits = line.partition(b";")[0].strip(b" \t")
    if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
        return None
    return int(digits, 16)
