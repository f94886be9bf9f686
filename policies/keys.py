"""A key of the policy file, declared once: its name, the type of its value, its default
and what it means.

The loader reads a key by its declaration (`policies/nodes.py` `Mapping.read`), the
frozen objects of `policies/model.py` take their defaults from it, and the generated
configuration reference (devtools/docs_reference.py) prints its meaning and default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

# Covariant: a Key[int] is a Key[object] (a block holds keys of every type).
T = TypeVar("T", covariant=True)

DAY_S = 86400.0


@dataclass(frozen=True)
class Text:
    """A non-empty string."""


@dataclass(frozen=True)
class Number:
    """A finite number of at least `minimum`; an integer only, if `integer`."""

    minimum: float = 0
    integer: bool = False


@dataclass(frozen=True)
class Flag:
    """true or false."""


@dataclass(frozen=True)
class Choice:
    """One of `options`."""

    options: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    """A mapping of the keys in `keys`, read by a function of its own."""

    keys: tuple[Key[object], ...]


@dataclass(frozen=True)
class Statuses:
    """A list of HTTP statuses, exact (`404`) or classes (`5xx`)."""


@dataclass(frozen=True)
class Items:
    """A list of strings."""


Kind = Text | Number | Flag | Choice | Block | Statuses | Items

TEXT = Text()
FLAG = Flag()
STATUSES = Statuses()
ITEMS = Items()


@dataclass(frozen=True)
class Key(Generic[T]):
    """`default` is what an absent key stands for (the model's default too); a required
    key has none that means anything. `shown` is the reference's default cell when
    the value alone would mislead (a default that depends on another key, or none)."""

    name: str
    kind: Kind
    default: T
    help: str
    required: bool = False
    shown: str | None = None

    @property
    def names(self) -> set[str]:
        """The keys its block allows (a block's only)."""
        assert isinstance(self.kind, Block)
        return {key.name for key in self.kind.keys}

    def child(self, name: str) -> Key[object]:
        """The key `name` of its block."""
        assert isinstance(self.kind, Block)
        return next(key for key in self.kind.keys if key.name == name)


def required(name: str, kind: Kind, help: str, shown: str = "required") -> Key[None]:
    return Key(name, kind, None, help, required=True, shown=shown)


def block(name: str, keys: tuple[Key[object], ...], help: str, shown: str = "—") -> Key[None]:
    return Key(name, Block(keys), None, help, shown=shown)
