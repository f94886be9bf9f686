"""Path templates (`/orders/{sku}`, `/items/{id:int}`, `/files/{rest:.*}`) and
string templates rendered from their parameters (`supplier:{sku}`)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import quote

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# A typed parameter stays inside one path segment; only an explicit regex may span several.
PARAM_TYPES = {
    "str": r"[^/]+",
    "int": r"[0-9]+",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
# Values tried when looking for a path that two routes both match.
_SAMPLE_SEGMENTS = ("x", "1", "00000000-0000-0000-0000-000000000000", "x/y", "")


class TemplateError(ValueError):
    pass


@dataclass(frozen=True)
class PathTemplate:
    raw: str
    pattern: re.Pattern[str]
    params: tuple[str, ...]
    # Literal text and parameter slots in order, for building sample paths.
    pieces: tuple[str | None, ...]

    @classmethod
    def parse(cls, raw: str) -> PathTemplate:
        if not raw.startswith("/"):
            raise TemplateError("a path template must start with '/'")
        if raw.startswith("/_fence/"):
            raise TemplateError("paths under /_fence/ are reserved for the proxy's own API")
        regex: list[str] = []
        params: list[str] = []
        pieces: list[str | None] = []
        position = 0
        for start, end, inner in _placeholders(raw):
            literal = raw[position:start]
            _check_path_literal(literal)
            regex.append(re.escape(literal))
            pieces.append(literal)
            name, _, kind = inner.partition(":")
            if not _NAME.match(name):
                raise TemplateError(f"parameter name {name!r} is not an identifier")
            if name in params:
                raise TemplateError(f"parameter {name!r} appears twice")
            regex.append(f"(?P<{name}>{_param_regex(name, kind)})")
            params.append(name)
            pieces.append(None)
            position = end
        _check_path_literal(raw[position:])
        regex.append(re.escape(raw[position:]))
        pieces.append(raw[position:])
        # DOTALL: the path is matched decoded, and a path has no lines: `%0A` is a
        # newline that `{rest:.*}` must take like any other character.
        pattern = re.compile("".join(regex) + r"\Z", re.DOTALL)
        return cls(raw, pattern, tuple(params), tuple(pieces))

    def match(self, path: str) -> dict[str, str] | None:
        found = self.pattern.match(path)
        return found.groupdict() if found else None

    def sample_paths(self, fillers: tuple[str, ...]) -> list[str]:
        """Paths this template may match, filling every slot with each filler in turn."""
        candidates = set(_SAMPLE_SEGMENTS) | set(fillers)
        samples = []
        for filler in sorted(candidates):
            samples.append("".join(filler if piece is None else piece for piece in self.pieces))
        return samples

    def literal_segments(self) -> tuple[str, ...]:
        return tuple(
            segment
            for piece in self.pieces
            if piece is not None
            for segment in piece.split("/")
            if segment
        )

    def overlaps(self, other: PathTemplate) -> str | None:
        """A path both templates match, if sampling finds one.

        Deciding regex intersection in general is out of reach; filling each template's
        slots with the other's literal segments and a few typical values catches the
        overlaps people actually write (a catch-all beside a specific route, two
        parameter names for one shape).
        """
        fillers = self.literal_segments() + other.literal_segments()
        for first, second in ((self, other), (other, self)):
            for path in first.sample_paths(fillers):
                if first.match(path) is not None and second.match(path) is not None:
                    return path
        return None


def _placeholders(raw: str) -> list[tuple[int, int, str]]:
    """(start, end, inside) of each top-level `{...}`; braces may nest inside a regex
    parameter (`{id:[0-9]{3}}`)."""
    found = []
    depth = 0
    start = 0
    for index, char in enumerate(raw):
        if char == "{":
            if depth == 0:
                start = index
            depth += 1
        elif char == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                found.append((start, index + 1, raw[start + 1 : index]))
    if depth:
        raise TemplateError("unbalanced '{' or '}'")
    return found


def _check_path_literal(literal: str) -> None:
    _reject_stray_braces(literal)
    if "?" in literal or "#" in literal:
        raise TemplateError("a path template matches the path only, without '?' or '#'")


def _param_regex(name: str, kind: str) -> str:
    if not kind:
        return PARAM_TYPES["str"]
    if kind in PARAM_TYPES:
        return PARAM_TYPES[kind]
    try:
        compiled = re.compile(kind)
    except re.error as exc:
        raise TemplateError(f"parameter {name!r} has an invalid regex {kind!r}: {exc}") from exc
    if compiled.groups:
        raise TemplateError(f"parameter {name!r}: use (?:...) instead of groups in {kind!r}")
    return kind


def _separators_in(literal: str) -> set[str]:
    return {char for char in literal if not (char.isascii() and char.isalnum())}


def _reject_stray_braces(literal: str) -> None:
    if "{" in literal or "}" in literal:
        raise TemplateError("unbalanced '{' or '}'")


@dataclass(frozen=True)
class StringTemplate:
    """`supplier:{sku}` — literal text with `{name}` slots filled from a dict."""

    raw: str
    names: tuple[str, ...]
    # The literal text before, between and after the slots (one more than `names`).
    literals: tuple[str, ...]

    @classmethod
    def parse(cls, raw: str) -> StringTemplate:
        names = []
        literals = []
        position = 0
        for placeholder in _PLACEHOLDER.finditer(raw):
            literal = raw[position : placeholder.start()]
            _reject_stray_braces(literal)
            name = placeholder.group(1)
            if not _NAME.match(name):
                raise TemplateError(f"placeholder {{{name}}} is not a parameter name")
            names.append(name)
            literals.append(literal)
            position = placeholder.end()
        _reject_stray_braces(raw[position:])
        literals.append(raw[position:])
        return cls(raw, tuple(names), tuple(literals))

    @functools.cached_property
    def separators(self) -> dict[str, str]:
        """Per parameter, the characters its value may not hold: the separators (every
        character but ASCII letters and digits) of the literal text on either side of
        it. A value holding one could pass for the template's own structure
        (`tenant:{t}:order:{id}` with t=`acme:evil`), so that two sets of values render
        one name and a glob like `tenant:acme:*` covers another tenant's parameter."""
        found: dict[str, set[str]] = {}
        for index, name in enumerate(self.names):
            around = self.literals[index] + self.literals[index + 1]
            found.setdefault(name, set()).update(_separators_in(around))
        return {name: "".join(sorted(chars)) for name, chars in found.items()}

    def unseparated(self) -> tuple[str, str] | None:
        """The first two parameters with no separator between them (`{a}{b}`, `{a}x{b}`):
        no character refused in their values can tell where one ends and the next
        begins."""
        for index in range(1, len(self.names)):
            if not _separators_in(self.literals[index]):
                return self.names[index - 1], self.names[index]
        return None

    def refused_value(self, values: dict[str, str]) -> tuple[str, str] | None:
        """(parameter, character) for the first value holding one of its separators."""
        for name, refused in self.separators.items():
            held = next((char for char in values[name] if char in refused), None)
            if held is not None:
                return name, held
        return None

    def render(self, values: dict[str, str], url_quote: bool = False) -> str:
        def fill(placeholder: re.Match[str]) -> str:
            value = values[placeholder.group(1)]
            return quote(value, safe="") if url_quote else value

        return _PLACEHOLDER.sub(fill, self.raw)
