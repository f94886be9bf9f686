"""core/frozen.py: a quick __init__ builds exactly what the dataclass's own would."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from core import fencing, lifecycle, outcomes, records, send_deadline
from core.frozen import quick_init
from proxy import forwarding
from store import types

# Every record a fenced write builds with the quick __init__.
QUICK = [
    records.LeaseRecord,
    records.ResourceState,
    records.StoredResponse,
    records.IdempotencyRecord,
    records.EffectRecord,
    fencing.Admit,
    fencing.Replay,
    fencing.AdmissionRequest,
    lifecycle.Plan,
    send_deadline.SendDeadline,
    outcomes.Answered,
    types.NewEffect,
    types.Admitted,
    types.Receipt,
    forwarding.UpstreamResponse,
]


def _as_dataclass_builds(cls: type) -> type:
    """`cls` again, with the dataclass's own __init__ (frozen, field by field)."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(f"Own{cls.__name__}", fields, frozen=True)


@pytest.mark.parametrize("cls", QUICK, ids=lambda cls: cls.__name__)
def test_the_quick_init_takes_the_same_parameters_and_fills_every_field(cls: type) -> None:
    own = _as_dataclass_builds(cls)
    assert str(inspect.signature(cls)) == str(inspect.signature(own))
    fields = dataclasses.fields(cls)
    # A distinct value per field, by position and by keyword: each lands in its own field.
    values = [object() for _ in fields]
    by_position = cls(*values)
    by_keyword = cls(**{f.name: v for f, v in zip(fields, values, strict=True)})
    expected = vars(own(*values))
    assert vars(by_position) == expected
    assert vars(by_keyword) == expected
    # The defaults are the dataclass's.
    required = [v for f, v in zip(fields, values, strict=True) if _required(f)]
    assert vars(cls(*required)) == vars(own(*required))


def _required(field: dataclasses.Field[Any]) -> bool:
    return field.default is dataclasses.MISSING


def test_a_quick_record_stays_frozen_equal_and_replaceable() -> None:
    deadline = send_deadline.SendDeadline(1.0, 2.0, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        deadline.window_s = 3.0  # type: ignore[misc]
    assert deadline == send_deadline.SendDeadline(1.0, 2.0, float)
    assert hash(deadline) == hash(send_deadline.SendDeadline(1.0, 2.0, float))
    assert dataclasses.replace(deadline, window_s=3.0) == send_deadline.SendDeadline(
        1.0, 3.0, float
    )


def test_only_what_it_can_build_exactly_is_given_a_quick_init() -> None:
    @dataclasses.dataclass
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slots:
        a: int

    @dataclasses.dataclass(frozen=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class KeywordOnly:
        a: int = dataclasses.field(kw_only=True)

    @dataclasses.dataclass(frozen=True)
    class NotInInit:
        a: int = dataclasses.field(default=1, init=False)

    # A field named like the generated __init__'s local would be shadowed by its parameter.
    Shadowing = dataclasses.make_dataclass("Shadowing", [("__quick_init_dict__", int)], frozen=True)

    for cls in (Mutable, PostInit, Slots, Factory, KeywordOnly, NotInInit, Shadowing, int):
        with pytest.raises(TypeError):
            quick_init(cls)
