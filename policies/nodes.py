"""A YAML reader that keeps line numbers, and a collector of config problems.

PyYAML's `safe_load` forgets where a value came from; a config error must name
the line and key at fault, so the policy parser walks the composed node tree.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from policies.keys import Choice, Flag, Key, Number, Text


@dataclass(frozen=True)
class Problem:
    line: int
    key: str
    message: str

    def format(self, filename: str) -> str:
        return f"{filename}:{self.line}: {self.key}: {self.message}"


@dataclass
class Problems:
    """Every problem found in one file; parsing goes on after the first."""

    items: list[Problem] = field(default_factory=list)

    def add(self, node: Node, message: str) -> None:
        self.items.append(Problem(node.line, node.key, message))

    def __bool__(self) -> bool:
        return bool(self.items)

    def about(self, key: str) -> bool:
        """Whether a problem was reported at `key` or under it. A value that failed its
        type check stands in as its default (`flag`, `choice`); a rule that reads it must
        not then report the default's consequences as a second error."""
        return any(p.key == key or p.key.startswith((f"{key}.", f"{key}[")) for p in self.items)


class ConfigError(Exception):
    def __init__(self, filename: str, problems: list[Problem]) -> None:
        self.filename = filename
        self.problems = sorted(problems, key=lambda p: (p.line, p.key))
        super().__init__("\n".join(p.format(filename) for p in self.problems))


_MISSING = object()
NOT_A_SCALAR = object()


@dataclass(frozen=True)
class Node:
    """A YAML node with the dotted key path that reached it."""

    raw: yaml.Node
    key: str

    @property
    def line(self) -> int:
        return int(self.raw.start_mark.line) + 1

    @property
    def is_mapping(self) -> bool:
        return isinstance(self.raw, yaml.MappingNode)

    @property
    def is_sequence(self) -> bool:
        return isinstance(self.raw, yaml.SequenceNode)

    def scalar(self) -> Any:
        """The plain Python value of a scalar node (str, int, float, bool, None); for a
        list or mapping, a marker that no type check accepts."""
        if not isinstance(self.raw, yaml.ScalarNode):
            return NOT_A_SCALAR
        try:
            return yaml.SafeLoader(stream="").construct_object(self.raw)
        except (yaml.YAMLError, ValueError, TypeError):
            return NOT_A_SCALAR

    def describe(self) -> str:
        if isinstance(self.raw, yaml.ScalarNode):
            value = self.scalar()
            if value is NOT_A_SCALAR:
                return f"{self.raw.value!r} tagged {self.raw.tag}"
            if value is None:  # `null`, `~` or nothing: named as YAML writes it
                return "null"
            return repr(value)
        return "a list" if self.is_sequence else "a mapping"

    def items(self) -> Iterator[tuple[str, Node]]:
        assert isinstance(self.raw, yaml.MappingNode)
        for key_node, value_node in self.raw.value:
            name = str(key_node.value)
            yield name, Node(value_node, f"{self.key}.{name}" if self.key else name)

    def elements(self) -> Iterator[Node]:
        assert isinstance(self.raw, yaml.SequenceNode)
        for index, item in enumerate(self.raw.value):
            yield Node(item, f"{self.key}[{index}]")


def unknown_key(name: str, allowed: set[str]) -> str:
    """A typo names the key it was meant to be; anything else lists what is allowed."""
    listed = f"allowed: {', '.join(sorted(allowed))}"
    near = difflib.get_close_matches(name, sorted(allowed), n=1)
    if near:
        return f"unknown key: did you mean {near[0]!r}? ({listed})"
    return f"unknown key ({listed})"


# PyYAML's parser and scanner problems, said as what the file needed at that point. The
# first fragment found in the problem picks the words; an unknown problem keeps PyYAML's.
_YAML_PROBLEMS = (
    (
        "mapping values are not allowed",
        "a ':' where no key can start: quote a value that "
        "holds ': ', or indent the key under its parent",
    ),
    (
        "expected <block end>",
        "this line is indented differently from the keys beside it: "
        "keys of one mapping start in one column, list items with '-' in one column",
    ),
    ("could not find expected ':'", "expected 'key: value' (a key and ':' then its value)"),
    (
        "cannot start any token",
        "a tab or a reserved character starts this value: indent "
        "with spaces, and quote a value that starts with @ or `",
    ),
    (
        "expected ',' or ']'",
        "a [ ] list is not closed: separate items with ',' and end it with ']'",
    ),
    (
        "expected ',' or '}'",
        "a { } mapping is not closed: separate entries with ',' and end it with '}'",
    ),
    (
        "found unexpected end of stream",
        "the file ends inside a quoted string: a closing quote is missing",
    ),
    ("expected the node content", "expected a value here"),
    ("found duplicate anchor", "an anchor (&name) is defined twice"),
    ("found undefined alias", "an alias (*name) names no anchor defined above it"),
)


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    raw = str(exc.problem or exc.context or "cannot be read")
    for fragment, words in _YAML_PROBLEMS:
        if fragment in raw:
            return words
    return raw


def compose(text: str, filename: str) -> Node:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = Problem(
            line, "<file>", f"not valid YAML at column {column}: {_yaml_problem(exc)}"
        )
        raise ConfigError(filename, [problem]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(filename, [Problem(1, "<file>", f"not valid YAML: {exc}")]) from None
    if root is None:
        raise ConfigError(filename, [Problem(1, "<file>", "the file is empty")])
    return Node(root, "")


class Mapping:
    """Typed access to a mapping node that reports unknown, duplicated and missing keys."""

    def __init__(self, node: Node, problems: Problems, allowed: set[str]) -> None:
        self.node = node
        self.problems = problems
        self.children: dict[str, Node] = {}
        if not node.is_mapping:
            problems.add(node, f"expected a mapping, got {node.describe()}")
            return
        for name, child in node.items():
            if name in self.children:
                problems.add(child, "key appears twice")
            elif name not in allowed:
                problems.add(child, unknown_key(name, allowed))
            self.children[name] = child

    @property
    def valid(self) -> bool:
        return self.node.is_mapping

    def child(self, name: str, required: bool = False) -> Node | None:
        found = self.children.get(name)
        if found is None and required and self.valid:
            # The key path names the missing key itself (`upstreams`, `listen.port`).
            path = f"{self.node.key}.{name}" if self.node.key else name
            self.problems.items.append(
                Problem(self.node.line, path, f"missing required key '{name}'")
            )
        return found

    def read(self, key: Key[object], default: Any = _MISSING) -> Any:
        """The value of `key` as its declaration says (a text, a number, a flag or a
        choice): the declared default when absent (`default` in its place, for one that
        depends on other keys), None when required and missing, or refused; each
        problem reported."""
        kind = key.kind
        if default is _MISSING and not key.required:
            default = key.default
        if isinstance(kind, Text):
            return self.text(key.name, default)
        if isinstance(kind, Number):
            return self.number(key.name, default, kind.minimum, kind.integer)
        if isinstance(kind, Flag):
            return self.flag(key.name, bool(default))
        if isinstance(kind, Choice):
            return self.choice(key.name, kind.options, str(default))
        raise TypeError(f"{key.name}: a {type(kind).__name__} has a reader of its own")

    def text(self, name: str, default: Any = _MISSING) -> Any:
        node = self.child(name, required=default is _MISSING)
        if node is None:
            return None if default is _MISSING else default
        value = node.scalar()
        if not isinstance(value, str) or not value:
            self.problems.add(node, f"expected a non-empty string, got {node.describe()}")
            return None
        return value

    def number(
        self, name: str, default: Any = _MISSING, minimum: float = 0, integer: bool = False
    ) -> Any:
        node = self.child(name, required=default is _MISSING)
        if node is None:
            return None if default is _MISSING else default
        value = node.scalar()
        kinds: tuple[type[int] | type[float], ...] = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            kind = "an integer" if integer else "a number"
            self.problems.add(node, f"expected {kind}, got {node.describe()}")
            return None
        if not math.isfinite(value):
            self.problems.add(node, f"expected a finite number, got {node.describe()}")
            return None
        if value < minimum:
            self.problems.add(node, f"must be at least {minimum}, got {value!r}")
            return None
        return value

    def flag(self, name: str, default: bool) -> bool:
        node = self.child(name)
        if node is None:
            return default
        value = node.scalar()
        if not isinstance(value, bool):
            self.problems.add(node, f"expected true or false, got {node.describe()}")
            return default
        return value

    def choice(self, name: str, options: tuple[str, ...], default: str) -> str:
        node = self.child(name)
        if node is None:
            return default
        value = node.scalar()
        if value not in options:
            self.problems.add(node, f"expected one of {', '.join(options)}, got {node.describe()}")
            return default
        return str(value)

    def text_list(self, name: str, required: bool = False) -> list[tuple[str, Node]] | None:
        """A list of strings with each element's node; integers count as strings ("404")."""
        node = self.child(name, required=required)
        if node is None:
            return None
        if not node.is_sequence:
            self.problems.add(node, f"expected a list, got {node.describe()}")
            return None
        values: list[tuple[str, Node]] = []
        for element in node.elements():
            value = element.scalar()
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str) or not value:
                self.problems.add(element, f"expected a string, got {element.describe()}")
                continue
            values.append((value, element))
        return values
