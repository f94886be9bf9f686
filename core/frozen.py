"""Frozen records that are quick to build.

A frozen dataclass's `__init__` sets each field through `object.__setattr__` (its own
`__setattr__` refuses): on CPython 3.11 about 0.3 µs a field, so an EffectRecord
(19 fields) takes 6 to 9 µs to build against about 2 µs for the same values written
into the instance's dict. A fenced write builds a dozen such records (the new effect,
its leases, the admission's decision, the receipt's plan and the effect after it, the
stored answer), some 30 µs of CPU on the event loop and the SQLite thread together,
which the plain proxy does not spend (bench/README.md, "The fenced path's Python on
SQLite"). `quick_init` gives a frozen dataclass an `__init__` that writes the dict
directly: the same parameters, in the same order, with the same defaults; the class
stays frozen (its `__setattr__` still refuses), equal and hashable as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

# The generated __init__'s local for the instance's dict; a field of this name is
# refused (its parameter would be shadowed by the local).
_DICT = "__quick_init_dict__"


def quick_init(cls: type[T]) -> type[T]:
    """`cls`, a frozen dataclass, with an `__init__` that fills the instance's dict.
    Only what that `__init__` can do exactly as the dataclass's own: every field an
    `__init__` parameter, positional or keyword, a plain default or none; no
    `__post_init__`, no `__slots__` (no dict to fill). Anything else is a TypeError,
    at import."""
    # `__dataclass_params__` is where dataclasses keeps the decorator's arguments.
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__} has a __post_init__ or __slots__")
    defaults: dict[str, Any] = {}
    signature: list[str] = []
    for field in dataclasses.fields(cls):
        if not field.init or field.kw_only or field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name}: not a plain __init__ parameter")
        if field.name == _DICT:
            raise TypeError(f"{cls.__name__}.{field.name}: the name of the __init__'s local")
        if field.default is dataclasses.MISSING:
            signature.append(field.name)
        else:
            defaults[f"_default_{field.name}"] = field.default
            signature.append(f"{field.name}=_default_{field.name}")
    names = [field.name for field in dataclasses.fields(cls)]
    source = f"def __init__(self, {', '.join(signature)}):\n    {_DICT} = self.__dict__\n"
    source += "".join(f"    {_DICT}[{name!r}] = {name}\n" for name in names)
    made: dict[str, Any] = {}
    exec(source, defaults, made)  # from the dataclass's own field names
    init = made["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
