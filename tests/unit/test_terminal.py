"""What the CLI prints of a stored string cannot drive the operator's terminal."""

from __future__ import annotations

import pytest

from proxy.terminal import printable


@pytest.mark.parametrize(
    ("stored", "printed"),
    [
        ("/orders/widget", "/orders/widget"),
        ("/esc\x1b[31mRED", "/esc\\x1b[31mRED"),
        ("line\nbreak\ttab\rreturn", "line\\nbreak\\ttab\\rreturn"),
        ("del\x7f c1\x9b", "del\\x7f c1\\x9b"),
        ("bidi\u202eevil", "bidi\\u202eevil"),
        ("a\\x1b", "a\\\\x1b"),
        ("caf\u00e9 \u6771\u4eac", "caf\u00e9 \u6771\u4eac"),
    ],
)
def test_control_characters_are_escaped_and_the_rest_kept(stored: str, printed: str) -> None:
    assert printable(stored) == printed


def test_nothing_printed_holds_a_control_character() -> None:
    every = "".join(map(chr, range(0x2FF)))
    assert all(character.isprintable() for character in printable(every))
