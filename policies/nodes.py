"""A YAML reader that keeps line numbers, and a collector of config problems.

PyYAML's `safe_load` forgets where a value came from; a config error must name
the line and key at fault, so the policy parser walks the composed node tree.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml


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


def compose(text: str, filename: str) -> Node:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        problem = Problem(line, "<file>", f"not valid YAML: {exc.problem}")
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
                problems.add(child, f"unknown key (allowed: {', '.join(sorted(allowed))})")
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
