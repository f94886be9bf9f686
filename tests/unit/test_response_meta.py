"""store/rows.py `response_meta` writes what json.dumps writes, for any stored answer."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from core.records import StoredResponse
from store.rows import response_meta, stored_response

# Any text: control characters, quotes, backslashes, non-ASCII, lone surrogates (what
# aiohttp makes of bytes that are not UTF-8).
TEXT = st.text(st.characters(codec=None), max_size=40)


@given(
    headers=st.lists(st.tuples(TEXT, TEXT), max_size=6).map(tuple),
    reason=st.none() | TEXT,
    body_kept=st.booleans(),
)
def test_response_meta_is_the_text_json_dumps_writes(
    headers: tuple[tuple[str, str], ...], reason: str | None, body_kept: bool
) -> None:
    response = StoredResponse(200, headers, b"", reason=reason, body_kept=body_kept)
    written = response_meta(response)
    assert written == json.dumps({"headers": headers, "reason": reason, "body_kept": body_kept})
    assert stored_response(200, written, b"") == response
