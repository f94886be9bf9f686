"""Text from the store, made safe to print on an operator's terminal.

Paths, reasons, holder and operator names are stored as sent, by anyone: a path
with `ESC [ 3 1 m` in it would recolour (or retitle, or worse) the terminal of the
operator who lists it. Every stored string the CLI prints goes through `printable`.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def printable(text: str) -> str:
    """`text` with every character that is not printable (control characters, C1,
    format characters such as bidi overrides, separators other than the space)
    escaped as Python's repr does (`\\x1b`, `\\n`, `\\u202e`); a backslash is doubled,
    so that what is printed reads back to one string only."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escaped(character) for character in text)


def _escaped(character: str) -> str:
    if character in _NAMED:
        return _NAMED[character]
    if character.isprintable():
        return character
    code = ord(character)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
