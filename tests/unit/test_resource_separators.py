"""A resource template's separators: per parameter, the characters
its value may not hold, derived from the literal text around it; templates whose
parameters cannot be told apart refused at load; `check-config` says what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies import parse_policy
from policies.templates import StringTemplate
from proxy.cli import main
from tests.unit.test_policies import assert_single_problem, edit


@pytest.mark.parametrize(
    ("raw", "separators"),
    [
        ("tenant:{t}:order:{id}", {"t": ":", "id": ":"}),
        ("supplier:{sku}", {"sku": ":"}),
        ("org/{o}.{r}", {"o": "./", "r": "."}),
        ("{sku}", {"sku": ""}),
        ("rule{id}", {"id": ""}),  # letters and digits separate nothing
        ("a-{x}_b=c+{y}@", {"x": "+-=_", "y": "+=@_"}),
        ("{a}:{b}/{a}", {"a": "/:", "b": "/:"}),  # a parameter used twice: both places
    ],
)
def test_separators_are_the_non_alphanumeric_characters_around_each_parameter(
    raw: str, separators: dict[str, str]
) -> None:
    assert StringTemplate.parse(raw).separators == separators


def test_a_value_holding_a_separator_is_named_with_its_parameter() -> None:
    template = StringTemplate.parse("tenant:{t}:order:{id}")
    assert template.refused_value({"t": "acme:evil", "id": "1"}) == ("t", ":")
    assert template.refused_value({"t": "acme", "id": "1:2"}) == ("id", ":")
    assert template.refused_value({"t": "acme", "id": "1"}) is None
    # Characters the template does not separate with stay allowed.
    assert template.refused_value({"t": "acme-eu.1", "id": "a/b"}) is None


@pytest.mark.parametrize(
    ("raw", "pair"),
    [
        ("{a}{b}", ("a", "b")),
        ("x:{a}x{b}", ("a", "b")),
        ("t:{a}:{b}{c}", ("b", "c")),
        ("t:{a}:{b}", None),
        ("{a}", None),
    ],
)
def test_parameters_with_no_separator_between_them_are_found(
    raw: str, pair: tuple[str, str] | None
) -> None:
    assert StringTemplate.parse(raw).unseparated() == pair


def test_a_resource_template_with_adjacent_parameters_is_refused_at_load() -> None:
    text = edit('path: "/orders/{sku}"', 'path: "/orders/{sku}/{n}"')
    text = edit('resource: "supplier:{sku}"', 'resource: "supplier:{sku}{n}"', text)
    assert_single_problem(
        text, 11, "routes[0].resource", "{sku} and {n} have no separator between them"
    )
    separated = edit('resource: "supplier:{sku}{n}"', 'resource: "supplier:{sku}:{n}"', text)
    assert parse_policy(separated).routes[0].resource is not None


def test_check_config_prints_the_characters_refused_per_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tenants.yaml"
    text = edit('path: "/orders/{sku}"', 'path: "/tenants/{t}/orders/{id}"')
    path.write_text(edit('"supplier:{sku}"', '"tenant:{t}:order:{id}"', text), encoding="utf-8")

    with pytest.raises(SystemExit) as exit_status:
        main(["check-config", str(path)])

    assert exit_status.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "  route place-order: resource 'tenant:{t}:order:{id}': "
        "{t} may not contain ':'; {id} may not contain ':'"
    ]
