"""Path templates match request paths; string templates render resources and probe paths."""

from __future__ import annotations

import pytest

from policies.templates import PathTemplate, StringTemplate, TemplateError

UUID = "123e4567-e89b-12d3-a456-426614174000"


def test_plain_parameter_captures_one_segment() -> None:
    template = PathTemplate.parse("/orders/{sku}")
    assert template.params == ("sku",)
    assert template.match("/orders/widget") == {"sku": "widget"}
    assert template.match("/orders/a/b") is None
    assert template.match("/orders/") is None


def test_literal_text_must_match_exactly() -> None:
    template = PathTemplate.parse("/orders/{sku}/lines")
    assert template.match("/orders/w/lines") == {"sku": "w"}
    assert template.match("/orders/w/lines/") is None
    assert template.match("/orders/w/line") is None
    assert template.match("/Orders/w/lines") is None


def test_literal_regex_characters_are_escaped() -> None:
    template = PathTemplate.parse("/v1.0/{id}")
    assert template.match("/v1.0/7") == {"id": "7"}
    assert template.match("/v1x0/7") is None


def test_int_parameter() -> None:
    template = PathTemplate.parse("/items/{id:int}")
    assert template.match("/items/0042") == {"id": "0042"}
    assert template.match("/items/42a") is None
    assert template.match("/items/") is None


def test_uuid_parameter() -> None:
    template = PathTemplate.parse("/items/{key:uuid}")
    assert template.match(f"/items/{UUID}") == {"key": UUID}
    assert template.match(f"/items/{UUID.upper()}") == {"key": UUID.upper()}
    assert template.match(f"/items/{UUID}0") is None
    assert template.match("/items/123e4567e89b12d3a456426614174000") is None


def test_explicit_str_type_is_one_segment() -> None:
    assert PathTemplate.parse("/a/{x:str}").match("/a/b/c") is None


def test_regex_parameter_may_span_segments() -> None:
    template = PathTemplate.parse("/files/{rest:.*}")
    assert template.match("/files/a/b/c.txt") == {"rest": "a/b/c.txt"}
    assert template.match("/files/") == {"rest": ""}
    assert template.match("/file") is None


def test_a_regex_dot_matches_any_character_of_the_decoded_path() -> None:
    # A path has no lines: "%0A" decodes to a newline, which is one more character.
    template = PathTemplate.parse("/files/{rest:.*}")
    assert template.match("/files/a\nb\r\x00") == {"rest": "a\nb\r\x00"}
    assert PathTemplate.parse("/files/{name}").match("/files/a\nb") == {"name": "a\nb"}


def test_regex_parameter_is_anchored_at_the_end() -> None:
    template = PathTemplate.parse("/v/{n:[0-9]+}")
    assert template.match("/v/12") == {"n": "12"}
    assert template.match("/v/12x") is None


def test_several_parameters() -> None:
    template = PathTemplate.parse("/shops/{shop}/orders/{id:int}")
    assert template.params == ("shop", "id")
    assert template.match("/shops/s1/orders/9") == {"shop": "s1", "id": "9"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("orders/{sku}", "must start with '/'"),
        ("/_fence/v1/leases", "reserved for the proxy's own API"),
        ("/orders/{sku", "unbalanced '{' or '}'"),
        ("/orders/sku}", "unbalanced '{' or '}'"),
        ("/orders}/{sku}", "unbalanced '{' or '}'"),
        ("/orders/{1sku}", "parameter name '1sku' is not an identifier"),
        ("/orders/{}", "parameter name '' is not an identifier"),
        ("/orders/{a}/{a}", "parameter 'a' appears twice"),
        ("/orders/{a:[}", "parameter 'a' has an invalid regex '['"),
        ("/orders/{a:(x|y)}", "use (?:...) instead of groups"),
        # The proxy matches the path alone: a template with a query or a fragment
        # would be accepted and then never match any request.
        ("/search?q={q}", "without '?' or '#'"),
        ("/orders/{sku}?v=1", "without '?' or '#'"),
        ("/help#{section}", "without '?' or '#'"),
        ("/page#top", "without '?' or '#'"),
    ],
)
def test_bad_path_templates_are_refused(raw: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        PathTemplate.parse(raw)
    assert message in str(info.value)


def test_non_capturing_group_is_allowed() -> None:
    template = PathTemplate.parse("/o/{kind:(?:a|b)}")
    assert template.match("/o/a") == {"kind": "a"}
    assert template.match("/o/c") is None


def test_catch_all_overlaps_a_specific_route() -> None:
    catch_all = PathTemplate.parse("/orders/{rest:.*}")
    specific = PathTemplate.parse("/orders/by-key/{key}")
    witness = catch_all.overlaps(specific)
    assert witness is not None
    assert catch_all.match(witness) is not None and specific.match(witness) is not None
    assert specific.overlaps(catch_all) is not None


def test_two_names_for_one_shape_overlap() -> None:
    assert PathTemplate.parse("/items/{a}").overlaps(PathTemplate.parse("/items/{b}")) is not None


def test_int_and_uuid_parameters_do_not_overlap() -> None:
    by_id = PathTemplate.parse("/items/{id:int}")
    by_uuid = PathTemplate.parse("/items/{key:uuid}")
    assert by_id.overlaps(by_uuid) is None


def test_different_literals_do_not_overlap() -> None:
    assert PathTemplate.parse("/orders/{a}").overlaps(PathTemplate.parse("/rules/{a}")) is None
    assert PathTemplate.parse("/a/{x}").overlaps(PathTemplate.parse("/a/{x}/b")) is None


def test_string_template_lists_its_names_and_renders() -> None:
    template = StringTemplate.parse("supplier:{sku}/{shop}")
    assert template.names == ("sku", "shop")
    assert template.render({"sku": "w1", "shop": "s"}) == "supplier:w1/s"


def test_string_template_without_placeholders_renders_itself() -> None:
    assert StringTemplate.parse("fixed").render({}) == "fixed"


def test_string_template_render_with_url_quote_escapes_everything_unsafe() -> None:
    template = StringTemplate.parse("/orders/by-key/{idempotency_key}")
    rendered = template.render({"idempotency_key": "a/b?c=d e#f"}, url_quote=True)
    assert rendered == "/orders/by-key/a%2Fb%3Fc%3Dd%20e%23f"


def test_string_template_render_without_quote_keeps_values() -> None:
    template = StringTemplate.parse("{a}:{b}")
    assert template.render({"a": "x/y", "b": "z"}) == "x/y:z"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("supplier:{sku:int}", "placeholder {sku:int} is not a parameter name"),
        ("supplier:{}", "placeholder {} is not a parameter name"),
        ("supplier:{sku", "unbalanced"),
        ("supplier:sku}", "unbalanced"),
        # A stray '}' in the very first position, alone or before a placeholder.
        ("}", "unbalanced"),
        ("}abc", "unbalanced"),
        ("}{sku}", "unbalanced"),
    ],
)
def test_bad_string_templates_are_refused(raw: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        StringTemplate.parse(raw)
    assert message in str(info.value)
