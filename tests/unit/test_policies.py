"""The policy file: YAML in, frozen validated objects out, every problem with line and key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from policies import (
    ConfigError,
    Limits,
    Outcome,
    Policy,
    Pool,
    Problem,
    Retention,
    StorePool,
    load_policy,
    parse_policy,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "example.yaml"

# A minimal valid policy. Line numbers matter: the bad-config tests edit one line
# and assert the exact line and key path of the problem.
VALID = """\
version: 1
listen: {host: 127.0.0.1, port: 8080}
store: sqlite:///state/test.db
leases: {min_ttl_s: 1, max_ttl_s: 300, default_ttl_s: 30}
upstreams:
  supplier: {url: "http://127.0.0.1:9001", timeout_s: 5, connect_timeout_s: 1}
routes:
  - name: place-order
    upstream: supplier
    match: {methods: [POST], path: "/orders/{sku}"}
    resource: "supplier:{sku}"
    fence: required
"""
# Lines 13+ are appended by `with_route_keys` (inside route 0) or `with_text`.


def edit(old: str, new: str, text: str = VALID) -> str:
    """VALID with one exact occurrence of `old` replaced."""
    assert text.count(old) == 1, f"{old!r} must occur exactly once"
    return text.replace(old, new)


def with_route_keys(*lines: str) -> str:
    """VALID with extra keys for route 0, starting on line 13."""
    return VALID + "".join(f"    {line}\n" for line in lines)


def with_text(*lines: str) -> str:
    """VALID with raw lines appended, starting on line 13."""
    return VALID + "".join(f"{line}\n" for line in lines)


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "bad.yaml")
    assert info.value.filename == "bad.yaml"
    return info.value.problems


def assert_single_problem(text: str, line: int, key: str, message_part: str) -> None:
    problems = problems_of(text)
    assert [(p.line, p.key) for p in problems] == [(line, key)], problems
    assert message_part in problems[0].message, problems[0].message


@pytest.fixture(scope="module")
def example() -> Policy:
    return load_policy(EXAMPLE)


# --- the example file -------------------------------------------------------------------


def test_the_valid_base_used_by_these_tests_parses() -> None:
    policy = parse_policy(VALID)
    assert [route.name for route in policy.routes] == ["place-order"]


def test_example_config_parses_into_the_documented_values(example: Policy) -> None:
    assert example.version == 1
    assert (example.listen.host, example.listen.port) == ("127.0.0.1", 8080)
    assert example.store == f"sqlite:///{EXAMPLE.parent.absolute() / '../state/fenceproxy.db'}"
    assert example.admin_token_env == "FENCEPROXY_ADMIN_TOKEN"
    assert (example.leases.min_ttl_s, example.leases.max_ttl_s) == (1, 300)
    assert example.leases.default_ttl_s == 30
    supplier = example.upstreams["supplier"]
    assert (supplier.url, supplier.timeout_s, supplier.connect_timeout_s) == (
        "http://127.0.0.1:9001",
        5,
        1,
    )
    assert [r.name for r in example.routes] == [
        "place-order",
        "read-orders",
        "put-rule",
        "read-rules",
    ]


def test_example_fenced_route_keeps_its_settings(example: Policy) -> None:
    route = example.route_named("place-order")
    assert route is not None
    assert route.fenced
    assert route.upstream is example.upstreams["supplier"]
    assert route.methods == frozenset({"POST"})
    assert route.path.raw == "/orders/{sku}"
    assert route.resource is not None and route.resource.raw == "supplier:{sku}"
    assert route.forward_fence_headers is True
    assert route.max_body_bytes == 65536
    assert route.max_in_flight == 1
    assert (route.idempotency.required, route.idempotency.retain_s) == (True, 86400)


def test_example_pass_through_route_has_no_resource(example: Policy) -> None:
    route = example.route_named("read-orders")
    assert route is not None
    assert not route.fenced
    assert route.resource is None
    assert route.reconcile is None


def test_route_defaults_apply_when_keys_are_absent() -> None:
    route = parse_policy(VALID).routes[0]
    assert route.forward_fence_headers is False
    assert route.max_body_bytes == 1_048_576
    assert route.max_in_flight == 1
    assert (route.idempotency.required, route.idempotency.retain_s) == (False, 86400)
    assert route.reconcile is None


def test_top_level_defaults_apply_when_sections_are_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Away from the project's folder: a store `make run` left in its state/ would be
    # the working directory's file the default path's guard refuses to skip silently.
    monkeypatch.chdir(tmp_path)
    text = edit("listen: {host: 127.0.0.1, port: 8080}\n", "")
    text = edit("leases: {min_ttl_s: 1, max_ttl_s: 300, default_ttl_s: 30}\n", "", text)
    text = edit("store: sqlite:///state/test.db\n", "", text)
    text = edit(", timeout_s: 5, connect_timeout_s: 1}", "}", text)
    policy = parse_policy(text, base_dir=Path("/srv/fence"))
    assert (policy.listen.host, policy.listen.port) == ("127.0.0.1", 8080)
    assert (policy.leases.min_ttl_s, policy.leases.max_ttl_s) == (1, 300)
    assert policy.leases.default_ttl_s == 30
    assert policy.store == "sqlite:////srv/fence/state/fenceproxy.db"
    assert policy.admin_token_env is None
    assert policy.upstreams["supplier"].timeout_s == 10
    assert policy.upstreams["supplier"].connect_timeout_s == 2
    assert policy.upstreams["supplier"].send_window_s == 5


def test_the_send_window_defaults_to_the_connect_timeout_when_that_is_longer() -> None:
    text = edit("timeout_s: 5, connect_timeout_s: 1}", "timeout_s: 9, connect_timeout_s: 7}")
    assert parse_policy(text).upstreams["supplier"].send_window_s == 7
    text = edit("connect_timeout_s: 1}", "connect_timeout_s: 1, send_window_s: 1.5}")
    assert parse_policy(text).upstreams["supplier"].send_window_s == 1.5


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ("0.5", "send_window_s (0.5) is below connect_timeout_s (1)"),
        ("61", "send_window_s (61) exceeds 60"),
        ("0", "must be at least 0.001"),
    ],
)
def test_a_send_window_out_of_bounds_is_refused(window: str, message: str) -> None:
    text = edit("connect_timeout_s: 1}", f"connect_timeout_s: 1, send_window_s: {window}}}")
    assert_single_problem(text, 6, "upstreams.supplier.send_window_s", message)


def test_upstream_url_loses_its_trailing_slash() -> None:
    text = edit('"http://127.0.0.1:9001"', '"http://127.0.0.1:9001/"')
    assert parse_policy(text).upstreams["supplier"].url == "http://127.0.0.1:9001"


def test_policy_objects_are_frozen(example: Policy) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        example.store = "sqlite:///other.db"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        example.routes[0].max_in_flight = 5  # type: ignore[misc]


def test_route_named_finds_a_route_or_none(example: Policy) -> None:
    route = example.route_named("put-rule")
    assert route is not None and route.name == "put-rule"
    assert example.route_named("no-such-route") is None


def test_load_of_a_missing_file_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_policy(tmp_path / "missing.yaml")
    assert info.value.filename == str(tmp_path / "missing.yaml")


def test_load_reports_problems_under_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(edit("version: 1", "version: 7"), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}:1: version: only version 1 is known, got 7"


# --- route matching ---------------------------------------------------------------------


def test_match_picks_the_route_by_method_and_path(example: Policy) -> None:
    found = example.match("POST", "/orders/widget")
    assert found is not None
    assert found.route.name == "place-order"
    assert found.params == {"sku": "widget"}


def test_match_the_same_path_with_another_method_picks_another_route(example: Policy) -> None:
    found = example.match("GET", "/orders/widget")
    assert found is not None
    assert found.route.name == "read-orders"
    assert found.params == {"rest": "widget"}


def test_match_returns_none_for_a_method_no_route_allows(example: Policy) -> None:
    assert example.match("DELETE", "/orders/widget") is None
    assert example.match("post", "/orders/widget") is None


def test_match_returns_none_for_an_unknown_path(example: Policy) -> None:
    assert example.match("POST", "/invoices/1") is None
    assert example.match("POST", "/orders") is None
    assert example.match("POST", "/orders/") is None


def test_plain_parameter_stays_inside_one_segment(example: Policy) -> None:
    assert example.match("POST", "/orders/a/b") is None


def test_regex_parameter_may_span_segments_and_be_empty(example: Policy) -> None:
    deep = example.match("GET", "/orders/by-key/k1/extra")
    assert deep is not None and deep.params == {"rest": "by-key/k1/extra"}
    empty = example.match("GET", "/orders/")
    assert empty is not None and empty.params == {"rest": ""}


TYPED = """\
version: 1
upstreams: {s: {url: "http://127.0.0.1:9001"}}
routes:
  - {name: by-id, upstream: s, fence: none, match: {methods: [GET], path: "/items/{id:int}"}}
  - {name: by-uuid, upstream: s, fence: none, match: {methods: [GET], path: "/items/{key:uuid}"}}
  - name: file
    upstream: s
    fence: none
    match: {methods: [GET], path: "/files/{name:[a-z]+}.txt"}
"""


def test_int_parameter_matches_digits_only() -> None:
    policy = parse_policy(TYPED)
    found = policy.match("GET", "/items/42")
    assert found is not None
    assert (found.route.name, found.params) == ("by-id", {"id": "42"})
    assert policy.match("GET", "/items/4x") is None
    assert policy.match("GET", "/items/-1") is None


def test_uuid_parameter_matches_a_uuid_only() -> None:
    policy = parse_policy(TYPED)
    uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    found = policy.match("GET", f"/items/{uuid}")
    assert found is not None
    assert (found.route.name, found.params) == ("by-uuid", {"key": uuid})
    assert policy.match("GET", "/items/0f8fad5b-d9cb-469f-a165") is None
    assert policy.match("GET", "/items/widget") is None


def test_regex_parameter_is_anchored_with_the_surrounding_literals() -> None:
    policy = parse_policy(TYPED)
    found = policy.match("GET", "/files/report.txt")
    assert found is not None and found.params == {"name": "report"}
    assert policy.match("GET", "/files/report.txt.bak") is None
    assert policy.match("GET", "/files/Report.txt") is None
    assert policy.match("GET", "/files/reportXtxt") is None


def test_routes_that_share_a_path_but_not_a_method_do_not_overlap() -> None:
    text = with_text(
        "  - name: read-order",
        "    upstream: supplier",
        "    fence: none",
        '    match: {methods: [GET], path: "/orders/{id}"}',
    )
    policy = parse_policy(text)
    found = policy.match("GET", "/orders/x")
    assert found is not None and found.route.name == "read-order"


# --- resource rendering -----------------------------------------------------------------


def test_resource_is_rendered_from_path_parameters(example: Policy) -> None:
    found = example.match("PUT", "/rules/r-17")
    assert found is not None and found.route.resource is not None
    assert found.route.resource.render(found.params) == "rule:r-17"


def test_resource_with_several_parameters_renders_each_in_place() -> None:
    text = edit('path: "/orders/{sku}"', 'path: "/shops/{shop}/orders/{sku}"')
    text = edit('resource: "supplier:{sku}"', 'resource: "{shop}/order:{sku}"', text)
    policy = parse_policy(text)
    found = policy.match("POST", "/shops/s1/orders/w9")
    assert found is not None and found.route.resource is not None
    assert found.route.resource.render(found.params) == "s1/order:w9"


def test_resource_without_placeholders_is_one_fixed_resource() -> None:
    text = edit('resource: "supplier:{sku}"', 'resource: "supplier:all"')
    route = parse_policy(text).routes[0]
    assert route.resource is not None
    assert route.resource.render({"sku": "ignored"}) == "supplier:all"


# --- status mapping ---------------------------------------------------------------------


def test_example_status_rules_map_classes_and_exact_codes(example: Policy) -> None:
    rules = example.routes[0].outcomes
    assert rules.classify(200) is Outcome.COMMITTED
    assert rules.classify(201) is Outcome.COMMITTED
    assert rules.classify(404) is Outcome.NOT_COMMITTED
    assert rules.classify(500) is Outcome.UNKNOWN
    assert rules.classify(503) is Outcome.UNKNOWN


def test_exact_code_beats_its_class(example: Policy) -> None:
    # 408 is listed under unknown while 4xx is not_committed: a timeout proves nothing.
    assert example.routes[0].outcomes.classify(408) is Outcome.UNKNOWN


def test_exact_code_beats_its_class_whichever_list_names_it() -> None:
    text = with_route_keys('outcomes: {committed: ["2xx", "409"], not_committed: ["4xx"]}')
    rules = parse_policy(text).routes[0].outcomes
    assert rules.classify(409) is Outcome.COMMITTED
    assert rules.classify(400) is Outcome.NOT_COMMITTED


def test_unmapped_status_is_unknown(example: Policy) -> None:
    rules = example.routes[0].outcomes
    assert rules.classify(302) is Outcome.UNKNOWN
    assert rules.classify(101) is Outcome.UNKNOWN


def test_defaults_apply_when_outcomes_is_absent() -> None:
    rules = parse_policy(VALID).routes[0].outcomes
    assert rules.classify(204) is Outcome.COMMITTED
    assert rules.classify(404) is Outcome.NOT_COMMITTED
    assert rules.classify(408) is Outcome.UNKNOWN
    assert rules.classify(502) is Outcome.UNKNOWN
    assert rules.classify(301) is Outcome.UNKNOWN


def test_a_listed_outcome_replaces_its_default_and_absent_ones_keep_theirs() -> None:
    text = with_route_keys('outcomes: {committed: ["201"]}')
    rules = parse_policy(text).routes[0].outcomes
    assert rules.classify(201) is Outcome.COMMITTED
    assert rules.classify(200) is Outcome.UNKNOWN  # 2xx is no longer committed
    assert rules.classify(404) is Outcome.NOT_COMMITTED  # default not_committed kept
    assert rules.classify(408) is Outcome.UNKNOWN  # default unknown kept


def test_status_codes_may_be_written_as_yaml_integers() -> None:
    text = with_route_keys("outcomes: {committed: [201], not_committed: [4xx]}")
    rules = parse_policy(text).routes[0].outcomes
    assert rules.classify(201) is Outcome.COMMITTED
    assert rules.classify(422) is Outcome.NOT_COMMITTED


# --- reconcile --------------------------------------------------------------------------


def test_example_reconcile_block_is_parsed(example: Policy) -> None:
    reconcile = example.routes[0].reconcile
    assert reconcile is not None
    assert reconcile.probe.method == "GET"
    assert reconcile.probe.path.raw == "/orders/by-key/{idempotency_key}"
    assert reconcile.probe.path.names == ("idempotency_key",)
    assert reconcile.rules.classify(200) is Outcome.COMMITTED
    assert reconcile.rules.classify(404) is Outcome.NOT_COMMITTED
    assert reconcile.rules.classify(500) is Outcome.UNKNOWN
    assert reconcile.rules.classify(201) is Outcome.UNKNOWN
    assert (reconcile.settle_s, reconcile.attempts) == (10, 5)


def test_probe_path_renders_url_quoted_values(example: Policy) -> None:
    reconcile = example.routes[0].reconcile
    assert reconcile is not None
    rendered = reconcile.probe.path.render({"idempotency_key": "a/b c"}, url_quote=True)
    assert rendered == "/orders/by-key/a%2Fb%20c"


def test_reconcile_defaults_and_path_parameters_in_the_probe() -> None:
    text = with_route_keys(
        "reconcile:",
        '  probe: {path: "/orders/{sku}/status"}',
        '  committed: ["200"]',
        '  not_committed: ["404", "410"]',
    )
    reconcile = parse_policy(text).routes[0].reconcile
    assert reconcile is not None
    assert reconcile.probe.method == "GET"
    assert reconcile.probe.path.names == ("sku",)
    assert reconcile.rules.classify(410) is Outcome.NOT_COMMITTED
    # settle_s defaults to the upstream's timeout: the shortest window that can be right.
    assert (reconcile.settle_s, reconcile.attempts) == (5, 5)


def test_a_settle_window_shorter_than_the_upstream_timeout_is_refused() -> None:
    # A write the proxy gave up on at 5 s may still land at 8 s: a "not found" at 2 s
    # would free its key for a second order.
    assert_single_problem(
        with_route_keys(
            "idempotency: {required: true}",
            "reconcile:",
            '  probe: {path: "/orders/by-key/{idempotency_key}"}',
            '  committed: ["200"]',
            '  not_committed: ["404"]',
            "  settle_s: 4.5",
        ),
        18,
        "routes[0].reconcile.settle_s",
        "settle_s (4.5) is below upstream supplier's timeout_s (5)",
    )


def test_a_settle_window_as_long_as_the_upstream_timeout_is_accepted() -> None:
    text = with_route_keys(
        "reconcile:",
        '  probe: {path: "/orders/{sku}"}',
        '  committed: ["200"]',
        '  not_committed: ["404"]',
        "  settle_s: 5",
    )
    reconcile = parse_policy(text).routes[0].reconcile
    assert reconcile is not None and reconcile.settle_s == 5


# --- bad configs: each problem with its exact line and key path -------------------------


def test_unknown_top_level_key() -> None:
    assert_single_problem(
        with_text("colour: blue"), 13, "colour", "unknown key (allowed: admin_token_env,"
    )


def test_unknown_key_nested_in_an_upstream() -> None:
    text = edit("connect_timeout_s: 1}", "connect_timeout_s: 1, retries: 3}")
    assert_single_problem(text, 6, "upstreams.supplier.retries", "unknown key")


def test_unknown_key_nested_in_a_route() -> None:
    assert_single_problem(
        with_route_keys("retries: 3"), 13, "routes[0].retries", "unknown key (allowed: fence,"
    )


def test_string_where_an_integer_is_expected() -> None:
    text = edit("port: 8080", 'port: "8080"')
    assert_single_problem(text, 2, "listen.port", "expected an integer, got '8080'")


def test_string_where_a_number_is_expected() -> None:
    text = edit("timeout_s: 5,", 'timeout_s: "5s",')
    assert_single_problem(text, 6, "upstreams.supplier.timeout_s", "expected a number, got '5s'")


def test_list_where_a_mapping_is_expected() -> None:
    text = edit("listen: {host: 127.0.0.1, port: 8080}", "listen: [127.0.0.1, 8080]")
    assert_single_problem(text, 2, "listen", "expected a mapping, got a list")


def test_list_where_a_nested_mapping_is_expected() -> None:
    assert_single_problem(
        with_route_keys("idempotency: [true]"),
        13,
        "routes[0].idempotency",
        "expected a mapping, got a list",
    )


def test_route_naming_an_undefined_upstream() -> None:
    text = edit("upstream: supplier", "upstream: warehouse")
    assert_single_problem(
        text, 9, "routes[0].upstream", "upstream 'warehouse' is not defined (defined: supplier)"
    )


def test_duplicate_route_names() -> None:
    text = with_text(
        "  - name: place-order",
        "    upstream: supplier",
        '    match: {methods: [PUT], path: "/carts/{cart}"}',
        '    resource: "cart:{cart}"',
    )
    assert_single_problem(
        text, 13, "routes[1]", "route name 'place-order' is already used on line 8"
    )


def test_resource_template_naming_a_parameter_the_path_does_not_have() -> None:
    text = edit('resource: "supplier:{sku}"', 'resource: "supplier:{item}"')
    assert_single_problem(
        text, 11, "routes[0].resource", "{item} is not a parameter of path '/orders/{sku}'"
    )


def test_resource_template_that_cannot_render_a_valid_resource_name() -> None:
    text = edit('resource: "supplier:{sku}"', 'resource: "supplier {sku}"')
    assert_single_problem(text, 11, "routes[0].resource", "cannot render a valid resource name")


CATCH_ALL_FIRST = """\
version: 1
upstreams: {s: {url: "http://127.0.0.1:9001"}}
routes:
  - {name: read-all, upstream: s, fence: none, match: {methods: [GET], path: "/orders/{rest:.*}"}}
  - {name: by-key, upstream: s, fence: none, match: {methods: [GET], path: "/orders/by-key/{key}"}}
"""


def test_catch_all_beside_a_specific_route_is_ambiguous() -> None:
    problems = problems_of(CATCH_ALL_FIRST)
    assert [(p.line, p.key) for p in problems] == [(5, "routes[1]")]
    assert "route 'by-key' and route 'read-all' (line 4) both match GET /orders/by-key/" in (
        problems[0].message
    )
    assert problems[0].message.endswith("matching would be ambiguous")


def test_ambiguous_routes_are_reported_with_the_files_other_problems() -> None:
    text = CATCH_ALL_FIRST.replace('upstreams: {s: {url: "http://127.0.0.1:9001"}}\n', "")
    problems = problems_of(text)
    assert [(p.line, p.key) for p in problems] == [
        (1, "upstreams"),
        (3, "routes[0].upstream"),
        (4, "routes[1]"),
        (4, "routes[1].upstream"),
    ]
    assert problems[2].message.endswith("matching would be ambiguous")


def test_two_parameter_names_for_one_path_shape_are_ambiguous() -> None:
    text = with_text(
        "  - name: place-order-again",
        "    upstream: supplier",
        '    match: {methods: [POST, PUT], path: "/orders/{item}"}',
        '    resource: "supplier:{item}"',
    )
    problems = problems_of(text)
    assert [(p.line, p.key) for p in problems] == [(13, "routes[1]")]
    assert "both match POST /orders/" in problems[0].message
    assert "(line 8)" in problems[0].message


def two_get_routes(first_path: str, second_path: str) -> str:
    return f"""\
version: 1
upstreams: {{s: {{url: "http://127.0.0.1:9001"}}}}
routes:
  - {{name: first, upstream: s, fence: none, match: {{methods: [GET], path: "{first_path}"}}}}
  - {{name: second, upstream: s, fence: none, match: {{methods: [GET], path: "{second_path}"}}}}
"""


def test_catch_all_beside_a_multi_segment_regex_is_ambiguous() -> None:
    # No literal segment to borrow: only a two-segment sample value finds the overlap.
    problems = problems_of(two_get_routes("/{a:.*}", "/{b:[a-z]+/[a-z]+}"))
    assert [(p.line, p.key, p.message) for p in problems] == [
        (
            5,
            "routes[1]",
            "route 'second' and route 'first' (line 4) both match GET /x/y; "
            "matching would be ambiguous",
        )
    ]


def test_two_regexes_that_both_match_an_empty_segment_are_ambiguous() -> None:
    # Digits and letters share no character: only an empty value finds the overlap.
    problems = problems_of(two_get_routes("/a/{x:[0-9]*}", "/a/{y:[a-z]*}"))
    assert [(p.line, p.key, p.message) for p in problems] == [
        (
            5,
            "routes[1]",
            "route 'second' and route 'first' (line 4) both match GET /a/; "
            "matching would be ambiguous",
        )
    ]


@pytest.mark.parametrize(
    ("first_path", "second_path", "witness"),
    [
        # Each overlap below is found by one kind of sample value only.
        ("/{name}", "/{word:[a-z]+}", "/x"),
        ("/items/{name}", "/items/{id:int}", "/items/1"),
        ("/items/{name}", "/items/{key:uuid}", "/items/00000000-0000-0000-0000-000000000000"),
        # Each route's slot accepts a literal segment of the other.
        ("/{section}/latest", "/orders/{version}", "/orders/latest"),
        # The literal text after the last parameter is part of the sample path.
        ("/orders/{a:int}/lines", "/orders/{b:int}/lines", "/orders/1/lines"),
    ],
)
def test_overlapping_routes_are_reported_with_a_path_both_match(
    first_path: str, second_path: str, witness: str
) -> None:
    problems = problems_of(two_get_routes(first_path, second_path))
    assert [(p.line, p.key, p.message) for p in problems] == [
        (
            5,
            "routes[1]",
            f"route 'second' and route 'first' (line 4) both match GET {witness}; "
            "matching would be ambiguous",
        )
    ]


def test_digit_and_letter_parameters_of_one_or_more_characters_do_not_overlap() -> None:
    # The same shapes as the empty-segment case above, minus the empty value.
    policy = parse_policy(two_get_routes("/a/{x:[0-9]+}", "/a/{y:[a-z]+}"))
    assert [route.name for route in policy.routes] == ["first", "second"]


def test_invalid_yaml_syntax() -> None:
    text = edit("port: 8080}", "port: 8080")
    problems = problems_of(text)
    assert [(p.line, p.key) for p in problems] == [(3, "<file>")]
    assert problems[0].message.startswith("not valid YAML at column ")


def test_bad_indentation_is_invalid_yaml_at_its_line() -> None:
    text = with_route_keys("  max_in_flight: 2")  # deeper than its siblings
    problems = problems_of(text)
    assert [(p.line, p.key) for p in problems] == [(13, "<file>")]
    assert "not valid YAML" in problems[0].message


def test_empty_file() -> None:
    assert_single_problem("", 1, "<file>", "the file is empty")


def test_file_of_only_comments_is_empty() -> None:
    assert_single_problem("# nothing here\n\n", 1, "<file>", "the file is empty")


def test_top_level_list_instead_of_a_mapping() -> None:
    assert_single_problem("- version: 1\n", 1, "", "expected a mapping, got a list")


def test_unsupported_version() -> None:
    text = edit("version: 1", "version: 2")
    assert_single_problem(text, 1, "version", "only version 1 is known, got 2")


def test_version_as_a_string_is_refused() -> None:
    text = edit("version: 1", 'version: "1"')
    assert_single_problem(text, 1, "version", "only version 1 is known, got '1'")


def test_missing_required_sections_are_each_reported_at_the_root_by_name() -> None:
    problems = problems_of("version: 1\n")
    assert [(p.line, p.key, p.message) for p in problems] == [
        (1, "routes", "missing required key 'routes'"),
        (1, "upstreams", "missing required key 'upstreams'"),
    ]


def test_store_with_an_unknown_url_scheme() -> None:
    text = edit("store: sqlite:///state/test.db", "store: mysql://db/fence")
    assert_single_problem(
        text, 3, "store", "expected sqlite:///PATH or postgresql://..., got 'mysql://db/fence'"
    )


def test_sqlite_store_without_three_slashes() -> None:
    text = edit("store: sqlite:///state/test.db", "store: sqlite://state/test.db")
    assert_single_problem(text, 3, "store", "expected sqlite:///PATH, got 'sqlite://state/test.db'")


def test_postgresql_store_url_is_accepted() -> None:
    text = edit("store: sqlite:///state/test.db", "store: postgresql://fence@db:5432/fence")
    assert parse_policy(text).store == "postgresql://fence@db:5432/fence"


@pytest.mark.parametrize(
    ("written", "opened"),
    [
        ("sqlite:///state/test.db", "sqlite:////srv/fence/state/test.db"),
        ("sqlite:///../f.db?synchronous=NORMAL", "sqlite:////srv/fence/../f.db?synchronous=NORMAL"),
        ("sqlite:////var/lib/fenceproxy/f.db", "sqlite:////var/lib/fenceproxy/f.db"),
    ],
)
def test_a_sqlite_path_is_read_from_the_policy_files_folder(written: str, opened: str) -> None:
    """As TLS files are: so that the CLI, run from any folder, opens the proxy's store."""
    text = edit("store: sqlite:///state/test.db", f"store: {written}")
    assert parse_policy(text, base_dir=Path("/srv/fence")).store == opened


def test_a_sqlite_path_with_a_nul_character_is_a_problem_not_a_traceback() -> None:
    # sqlite3.connect raises ValueError on it: refused where the file is read instead.
    text = edit("store: sqlite:///state/test.db", 'store: "sqlite:///state/te\\0st.db"')
    assert_single_problem(text, 3, "store", "expected sqlite:///PATH, got")


def test_a_store_left_where_the_working_directory_put_it_is_named_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before this rule a relative path was read from the working directory: a proxy
    upgraded in place must not start on a new empty store beside its policy file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "test.db").write_bytes(b"")
    policy_folder = tmp_path / "config"
    policy_folder.mkdir()
    with pytest.raises(ConfigError) as refused:
        parse_policy(VALID, "config/policy.yaml", policy_folder)
    problems = refused.value.problems
    assert [(p.line, p.key) for p in problems] == [(3, "store")], problems
    assert problems[0].message == (
        f"the SQLite path state/test.db is read from this file's folder:"
        f" {policy_folder / 'state/test.db'} does not exist, but"
        f" {tmp_path / 'state/test.db'} (from the working directory) does; write the store's"
        f" path absolute (sqlite:///{tmp_path / 'state/test.db'}) or from this file's folder"
    )
    # Once the store is beside the policy file (or the path says where it is): no problem.
    (policy_folder / "state").mkdir()
    (policy_folder / "state" / "test.db").write_bytes(b"")
    beside = f"sqlite:///{policy_folder / 'state/test.db'}"
    assert parse_policy(VALID, "config/policy.yaml", policy_folder).store == beside


def test_statement_cache_size_in_the_store_url_names_the_option_to_use() -> None:
    text = edit(
        "store: sqlite:///state/test.db",
        "store: postgresql://fence@db:5432/fence?sslmode=disable&statement_cache_size=0",
    )
    assert_single_problem(text, 3, "store", "set store_pool.statement_cache: false instead")


def test_store_pool_options_parse_with_their_defaults() -> None:
    assert parse_policy(VALID).store_pool == StorePool(1, 10, True, 5.0, 30.0)
    text = with_text(
        "store_pool: {max_size: 4, statement_cache: false, acquire_timeout_s: 0.5,"
        " command_timeout_s: 2}"
    )
    assert parse_policy(text).store_pool == StorePool(1, 4, False, 0.5, 2.0)


def test_store_pool_statement_cache_must_be_a_boolean() -> None:
    text = with_text("store_pool: {statement_cache: off-please}")
    assert_single_problem(text, 13, "store_pool.statement_cache", "expected true or false")


def test_store_pool_timeouts_must_be_positive() -> None:
    text = with_text("store_pool: {acquire_timeout_s: 0}")
    assert_single_problem(text, 13, "store_pool.acquire_timeout_s", "must be at least 0.001")


def test_min_ttl_above_max_ttl() -> None:
    text = edit("min_ttl_s: 1, max_ttl_s: 300", "min_ttl_s: 500, max_ttl_s: 300")
    assert_single_problem(text, 4, "leases", "min_ttl_s (500) is above max_ttl_s (300)")


def test_default_ttl_outside_the_bounds() -> None:
    text = edit("default_ttl_s: 30", "default_ttl_s: 400")
    assert_single_problem(text, 4, "leases", "default_ttl_s (400) is outside [1, 300]")


def test_ttl_of_zero_is_refused() -> None:
    text = edit("min_ttl_s: 1,", "min_ttl_s: 0,")
    assert_single_problem(text, 4, "leases.min_ttl_s", "must be at least 0.001, got 0")


def test_port_above_the_tcp_range() -> None:
    text = edit("port: 8080", "port: 70000")
    assert_single_problem(text, 2, "listen.port", "not a TCP port: 70000")


def test_negative_port() -> None:
    text = edit("port: 8080", "port: -1")
    assert_single_problem(text, 2, "listen.port", "must be at least 0, got -1")


def test_unknown_http_method() -> None:
    text = edit("methods: [POST]", "methods: [POST, FETCH]")
    assert_single_problem(text, 10, "routes[0].match.methods[1]", "unknown HTTP method 'FETCH'")


def test_empty_method_list() -> None:
    text = edit("methods: [POST]", "methods: []")
    assert_single_problem(text, 10, "routes[0].match.methods", "at least one method is needed")


def test_invalid_regex_in_a_path_parameter() -> None:
    text = edit('path: "/orders/{sku}"', 'path: "/orders/{sku:[a-z}"')
    assert_single_problem(
        text, 10, "routes[0].match.path", "parameter 'sku' has an invalid regex '[a-z'"
    )


def test_capturing_group_in_a_path_regex_is_refused() -> None:
    text = edit('path: "/orders/{sku}"', 'path: "/orders/{sku:(a|b)}"')
    assert_single_problem(text, 10, "routes[0].match.path", "use (?:...) instead of groups")


def test_path_parameter_appearing_twice() -> None:
    text = edit('path: "/orders/{sku}"', 'path: "/orders/{sku}/{sku}"')
    assert_single_problem(text, 10, "routes[0].match.path", "parameter 'sku' appears twice")


def test_path_not_starting_with_a_slash() -> None:
    text = edit('path: "/orders/{sku}"', 'path: "orders/{sku}"')
    assert_single_problem(
        text, 10, "routes[0].match.path", "a path template must start with '/' in 'orders/{sku}'"
    )


def test_path_under_the_reserved_fence_prefix() -> None:
    text = edit('path: "/orders/{sku}"', 'path: "/_fence/v1/{sku}"')
    assert_single_problem(text, 10, "routes[0].match.path", "reserved for the proxy's own API")


@pytest.mark.parametrize("path", ["/orders?sku={sku}", "/orders/{sku}#top"])
def test_query_or_fragment_in_a_path_template_is_refused(path: str) -> None:
    # Routes match the request path only; such a route would load and never match.
    text = edit('path: "/orders/{sku}"', f'path: "{path}"')
    assert_single_problem(
        text,
        10,
        "routes[0].match.path",
        f"a path template matches the path only, without '?' or '#' in '{path}'",
    )


def test_fenced_route_without_a_resource() -> None:
    text = edit('    resource: "supplier:{sku}"\n', "")
    assert_single_problem(
        text, 8, "routes[0]", "a fenced route (fence: required) needs a 'resource' template"
    )


def test_unknown_fence_mode() -> None:
    text = edit("fence: required", "fence: sometimes")
    assert_single_problem(
        text, 12, "routes[0].fence", "expected one of required, none, got 'sometimes'"
    )


def test_flag_given_as_a_string() -> None:
    assert_single_problem(
        with_route_keys('forward_fence_headers: "yes"'),
        13,
        "routes[0].forward_fence_headers",
        "expected true or false, got 'yes'",
    )


def test_max_in_flight_below_one() -> None:
    assert_single_problem(
        with_route_keys("max_in_flight: 0"),
        13,
        "routes[0].max_in_flight",
        "must be at least 1, got 0",
    )


def test_status_code_mapped_to_two_outcomes() -> None:
    text = with_route_keys("outcomes:", '  committed: ["2xx", "409"]', '  not_committed: ["409"]')
    assert_single_problem(
        text, 15, "routes[0].outcomes.not_committed[0]", "409 is mapped to two outcomes"
    )


def test_status_class_mapped_to_two_outcomes() -> None:
    text = with_route_keys('outcomes: {committed: ["2xx"], unknown: ["2xx"]}')
    assert_single_problem(
        text, 13, "routes[0].outcomes.unknown[0]", "2xx is mapped to two outcomes"
    )


@pytest.mark.parametrize("pattern", ["2XX", "600", "20", "2xx0", "099"])
def test_bad_status_pattern(pattern: str) -> None:
    text = with_route_keys(f'outcomes: {{committed: ["{pattern}"]}}')
    assert_single_problem(
        text,
        13,
        "routes[0].outcomes.committed[0]",
        f"expected a status like 404 or 5xx, got {pattern!r}",
    )


def test_unknown_outcome_name() -> None:
    text = with_route_keys('outcomes: {committed: ["2xx"], maybe: ["3xx"]}')
    assert_single_problem(text, 13, "routes[0].outcomes.maybe", "unknown key")


def test_upstream_idempotent_defaults_to_false() -> None:
    assert parse_policy(VALID).routes[0].upstream_idempotent is False


def test_upstream_idempotent_with_required_keys_is_accepted() -> None:
    text = with_route_keys("idempotency: {required: true}", "upstream_idempotent: true")
    assert parse_policy(text).routes[0].upstream_idempotent is True


def test_upstream_idempotent_without_required_keys() -> None:
    assert_single_problem(
        with_route_keys("upstream_idempotent: true"),
        13,
        "routes[0].upstream_idempotent",
        "upstream_idempotent needs idempotency.required: true",
    )


RECONCILE = (
    "idempotency: {required: true}",
    "reconcile:",
    '  probe: {method: GET, path: "/orders/by-key/{idempotency_key}"}',
    '  committed: ["200"]',
    '  not_committed: ["404"]',
)


def test_the_reconcile_fragment_used_by_these_tests_parses() -> None:
    assert parse_policy(with_route_keys(*RECONCILE)).routes[0].reconcile is not None


def test_reconcile_probe_path_naming_an_unknown_placeholder() -> None:
    lines = list(RECONCILE)
    lines[2] = '  probe: {method: GET, path: "/orders/{order_id}"}'
    assert_single_problem(
        with_route_keys(*lines),
        15,
        "routes[0].reconcile.probe.path",
        "{order_id} is neither a path parameter of the route nor {idempotency_key}",
    )


def test_reconcile_probe_on_idempotency_key_needs_required_keys() -> None:
    assert_single_problem(
        with_route_keys(*RECONCILE[1:]),
        14,
        "routes[0].reconcile.probe.path",
        "{idempotency_key} needs idempotency.required: true on the route",
    )


def test_reconcile_probe_method_must_be_safe() -> None:
    lines = list(RECONCILE)
    lines[2] = '  probe: {method: POST, path: "/orders/by-key/{idempotency_key}"}'
    assert_single_problem(
        with_route_keys(*lines),
        15,
        "routes[0].reconcile.probe.method",
        "expected one of GET, HEAD, got 'POST'",
    )


def test_reconcile_without_not_committed_statuses() -> None:
    assert_single_problem(
        with_route_keys(*RECONCILE[:-1]),
        15,  # a block's own problems point at its first line
        "routes[0].reconcile.not_committed",
        "missing required key 'not_committed'",
    )


def test_reconcile_on_a_pass_through_route() -> None:
    text = edit('    resource: "supplier:{sku}"\n', "")
    text = edit("fence: required", "fence: none", text)
    text += "".join(f"    {line}\n" for line in RECONCILE)
    problems = problems_of(text)
    # Lines shift up by one (no resource line); the block itself starts at `probe:`.
    assert [(p.line, p.key) for p in problems] == [(14, "routes[0].reconcile")]
    assert problems[0].message == "reconcile only applies to fenced routes"


def test_connect_timeout_above_the_whole_timeout() -> None:
    text = edit("timeout_s: 5, connect_timeout_s: 1", "timeout_s: 5, connect_timeout_s: 9")
    assert_single_problem(
        text, 6, "upstreams.supplier", "connect_timeout_s (9) exceeds timeout_s (5)"
    )


def test_upstream_url_that_is_not_http() -> None:
    text = edit('"http://127.0.0.1:9001"', '"ftp://127.0.0.1:9001"')
    assert_single_problem(text, 6, "upstreams.supplier.url", "expected an http(s) URL")


def test_duplicate_key_in_one_mapping() -> None:
    assert_single_problem(
        with_route_keys("fence: none"), 13, "routes[0].fence", "key appears twice"
    )


def test_duplicate_key_in_a_flow_mapping() -> None:
    text = edit("port: 8080}", "port: 8080, port: 8081}")
    assert_single_problem(text, 2, "listen.port", "key appears twice")


def test_duplicate_upstream_names() -> None:
    text = edit(
        "routes:\n",
        '  supplier: {url: "http://127.0.0.1:9002"}\nroutes:\n',
    )
    assert_single_problem(text, 7, "upstreams.supplier", "upstream name appears twice")


def test_empty_route_list() -> None:
    text = VALID.split("routes:")[0] + "routes: []\n"
    assert_single_problem(text, 7, "routes", "at least one route is needed")


def test_several_problems_are_all_reported_at_once_sorted_by_line() -> None:
    text = """\
version: 3
listen: {host: 127.0.0.1, port: 99999}
store: redis://cache
upstreams:
  supplier: {url: "http://127.0.0.1:9001", timeout_s: fast}
routes:
  - name: place-order
    upstream: supplier
    match: {methods: [POST, FETCH], path: "/orders/{sku}"}
    resource: "supplier:{item}"
    colour: red
  - name: read-orders
    upstream: nowhere
    fence: none
    match: {methods: [GET], path: "orders"}
"""
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "bad.yaml")
    problems = info.value.problems
    assert [(p.line, p.key) for p in problems] == [
        (1, "version"),
        (2, "listen.port"),
        (3, "store"),
        (5, "upstreams.supplier.timeout_s"),
        (9, "routes[0].match.methods[1]"),
        (10, "routes[0].resource"),
        (11, "routes[0].colour"),
        (13, "routes[1].upstream"),
        (15, "routes[1].match.path"),
    ]
    lines = str(info.value).splitlines()
    assert len(lines) == len(problems)
    assert lines[0] == "bad.yaml:1: version: only version 1 is known, got 3"
    assert lines[1] == "bad.yaml:2: listen.port: not a TCP port: 99999"
    assert all(line.startswith("bad.yaml:") for line in lines)


# --- regressions: inputs the parser once accepted or crashed on ----------------------------
# "A bad file is refused with every problem listed, each with its line and the key at
# fault": a Python exception escaping parse_policy, or a silently accepted value, breaks it.


def test_regression_version_given_as_a_list_is_a_config_error_not_a_crash() -> None:
    # Node.scalar() used to assert on a non-scalar node: AssertionError escaped.
    text = edit("version: 1", "version: [1]")
    assert_single_problem(text, 1, "version", "only version 1 is known")


def test_regression_version_true_is_not_version_1() -> None:
    # `True == 1` in Python, so `version: true` used to pass as version 1.
    text = edit("version: 1", "version: true")
    assert_single_problem(text, 1, "version", "only version 1 is known")


@pytest.mark.parametrize("value", ["!!int five", "!env TIMEOUT"], ids=["bad-int-tag", "custom-tag"])
def test_regression_explicit_yaml_tag_is_a_config_error_not_a_crash(value: str) -> None:
    # Node.scalar() constructs the value outside compose(): ValueError / ConstructorError
    # used to escape.
    text = edit("timeout_s: 5,", f"timeout_s: {value},")
    problems = problems_of(text)
    assert [(p.line, p.key) for p in problems] == [(6, "upstreams.supplier.timeout_s")]


def test_regression_malformed_upstream_url_is_a_config_error_not_a_crash() -> None:
    # urlsplit raises ValueError("Invalid IPv6 URL"), which used to escape parse_policy.
    text = edit('"http://127.0.0.1:9001"', '"http://[::1:9001"')
    assert_single_problem(text, 6, "upstreams.supplier.url", "expected an http(s) URL")


def test_regression_upstream_url_with_a_port_out_of_range_is_refused() -> None:
    text = edit('"http://127.0.0.1:9001"', '"http://127.0.0.1:99999"')
    assert_single_problem(text, 6, "upstreams.supplier.url", "99999")


@pytest.mark.parametrize(
    ("old", "new", "line", "key"),
    [
        ("timeout_s: 5,", "timeout_s: .nan,", 6, "upstreams.supplier.timeout_s"),
        (
            "connect_timeout_s: 1}",
            "connect_timeout_s: .nan}",
            6,
            "upstreams.supplier.connect_timeout_s",
        ),
    ],
    ids=["timeout_s", "connect_timeout_s"],
)
def test_regression_nan_timeout_is_refused(old: str, new: str, line: int, key: str) -> None:
    # NaN passes `value < minimum` and `connect > timeout`; a NaN upstream timeout would
    # make `remaining < timeout` always false, so lease_too_short could never refuse a write.
    problems = problems_of(edit(old, new))
    assert [(p.line, p.key) for p in problems] == [(line, key)]


# --- retention of the audit trail ---------------------------------------------------------

DAY = 86400.0


def test_retention_defaults_to_30_days_of_effects_and_7_of_rejections() -> None:
    assert parse_policy(VALID).retention == Retention(30 * DAY, 7 * DAY, 1000)


def test_example_config_keeps_the_documented_retention(example: Policy) -> None:
    assert example.retention == Retention(30 * DAY, 7 * DAY, 1000)


def test_retention_block_in_days_fractions_allowed() -> None:
    text = with_text("retention: {effects_days: 90, rejections_days: 0.5, batch: 250}")
    assert parse_policy(text).retention == Retention(90 * DAY, 0.5 * DAY, 250)


def test_lease_retention_in_days_fractions_allowed_zero_keeps_forever() -> None:
    assert parse_policy(VALID).retention.leases_s == 30 * DAY
    text = with_text("retention: {leases_days: 0.25}")
    assert parse_policy(text).retention == Retention(30 * DAY, 7 * DAY, 1000, 0.25 * DAY)
    assert parse_policy(with_text("retention: {leases_days: 0}")).retention.leases_s == 0


def test_retention_keys_left_out_take_their_defaults() -> None:
    text = with_text("retention: {rejections_days: 1}")
    assert parse_policy(text).retention == Retention(30 * DAY, 1 * DAY, 1000)


def test_retention_zero_keeps_forever() -> None:
    text = with_text("retention: {effects_days: 0, rejections_days: 0}")
    assert parse_policy(text).retention == Retention(0, 0, 1000)


def test_default_effect_retention_stretches_to_the_longest_key_retention() -> None:
    # A receipt is what a retained key replays from: it is kept at least as long.
    text = with_route_keys("idempotency: {required: true, retain_s: 3456000}")  # 40 days
    assert parse_policy(text).retention.effects_s == 40 * DAY


def test_effect_retention_shorter_than_a_key_retention_is_refused() -> None:
    text = with_route_keys("idempotency: {required: true, retain_s: 172800}") + (
        "retention: {effects_days: 1}\n"
    )
    assert_single_problem(
        text,
        14,
        "retention.effects_days",
        "1 days is shorter than idempotency.retain_s of route 'place-order' (172800 s = 2 days)",
    )


def test_a_key_retention_does_not_matter_when_effects_are_kept_forever() -> None:
    text = with_route_keys("idempotency: {required: true, retain_s: 172800}") + (
        "retention: {effects_days: 0}\n"
    )
    assert parse_policy(text).retention.effects_s == 0


@pytest.mark.parametrize(
    ("value", "key", "message"),
    [
        ("{effects_days: -1}", "retention.effects_days", "must be at least 0, got -1"),
        ("{rejections_days: -0.5}", "retention.rejections_days", "must be at least 0, got -0.5"),
        ("{effects_days: .nan}", "retention.effects_days", "expected a finite number, got nan"),
        ("{rejections_days: .inf}", "retention.rejections_days", "expected a finite number"),
        ("{effects_days: -.inf}", "retention.effects_days", "expected a finite number"),
        ("{effects_days: thirty}", "retention.effects_days", "expected a number, got 'thirty'"),
        ("{effects_days: true}", "retention.effects_days", "expected a number, got True"),
        ("{effects_days: [30]}", "retention.effects_days", "expected a number, got a list"),
        ("{batch: 0}", "retention.batch", "must be at least 1, got 0"),
        ("{batch: -5}", "retention.batch", "must be at least 1, got -5"),
        ("{batch: 1.5}", "retention.batch", "expected an integer, got 1.5"),
        ("{batch: 20000}", "retention.batch", "must be at most 10000 (one pass is one"),
        ("{keep_days: 3}", "retention.keep_days", "(allowed: batch, effects_days,"),
        ("{leases_days: -1}", "retention.leases_days", "must be at least 0, got -1"),
        ("{leases_days: .nan}", "retention.leases_days", "expected a finite number, got nan"),
        ("{leases_days: forever}", "retention.leases_days", "expected a number, got 'forever'"),
        ("[30, 7]", "retention", "expected a mapping, got a list"),
        ("30", "retention", "expected a mapping, got 30"),
    ],
    ids=[
        "negative-effects",
        "negative-rejections",
        "nan",
        "inf",
        "minus-inf",
        "string",
        "bool",
        "list-value",
        "batch-zero",
        "batch-negative",
        "batch-fraction",
        "batch-too-large",
        "unknown-key",
        "negative-leases",
        "nan-leases",
        "string-leases",
        "list",
        "scalar",
    ],
)
def test_bad_retention_is_refused_with_line_and_key(value: str, key: str, message: str) -> None:
    assert_single_problem(with_text(f"retention: {value}"), 13, key, message)


def test_every_retention_problem_is_reported_at_once() -> None:
    text = with_text(
        "retention:",
        "  effects_days: -3",
        "  rejections_days: .nan",
        "  batch: 0",
        "  batch_size: 10",
    )
    problems = problems_of(text)
    assert [(p.line, p.key) for p in problems] == [
        (14, "retention.effects_days"),
        (15, "retention.rejections_days"),
        (16, "retention.batch"),
        (17, "retention.batch_size"),
    ]


# --- limits and upstream pools -----------------------------------


def test_limits_and_pools_have_defaults_when_absent() -> None:
    policy = parse_policy(VALID)
    assert policy.limits == Limits(
        header_timeout_s=15, body_timeout_s=30, max_requests=1024, max_connections=1280
    )
    assert policy.upstreams["supplier"].pool == Pool(fenced=256, pass_through=256)


def test_limits_are_read() -> None:
    text = with_text(
        "limits: {header_timeout_s: 2.5, body_timeout_s: 0.5, max_requests: 7, max_connections: 9}"
    )
    assert parse_policy(text).limits == Limits(2.5, 0.5, 7, 9)


def test_a_limit_left_out_keeps_its_default() -> None:
    assert parse_policy(with_text("limits: {max_requests: 7}")).limits == Limits(15, 30, 7)


def test_an_upstream_pool_is_read_and_a_size_left_out_keeps_its_default() -> None:
    text = edit("connect_timeout_s: 1}", "connect_timeout_s: 1, pool: {fenced: 3}}")
    assert parse_policy(text).upstreams["supplier"].pool == Pool(3, 256)


def test_a_zero_body_timeout_is_refused() -> None:
    assert_single_problem(
        with_text("limits: {body_timeout_s: 0}"),
        13,
        "limits.body_timeout_s",
        "must be at least 0.001, got 0",
    )


def test_a_zero_header_timeout_is_refused() -> None:
    assert_single_problem(
        with_text("limits: {header_timeout_s: 0}"),
        13,
        "limits.header_timeout_s",
        "must be at least 0.001, got 0",
    )


def test_max_requests_must_be_a_positive_integer() -> None:
    assert_single_problem(
        with_text("limits: {max_requests: 0}"), 13, "limits.max_requests", "must be at least 1"
    )
    assert_single_problem(
        with_text("limits: {max_requests: 1.5}"),
        13,
        "limits.max_requests",
        "expected an integer, got 1.5",
    )


def test_max_connections_must_be_a_positive_integer() -> None:
    assert_single_problem(
        with_text("limits: {max_connections: 0}"),
        13,
        "limits.max_connections",
        "must be at least 1",
    )


def test_unverified_waits_are_a_quarter_of_max_requests_unless_given() -> None:
    assert parse_policy(VALID).limits.unverified_waits == 256
    assert parse_policy(with_text("limits: {max_requests: 7}")).limits.unverified_waits == 1
    given = parse_policy(with_text("limits: {max_requests: 7, max_unverified_waits: 6}"))
    assert given.limits == Limits(15, 30, 7, max_unverified_waits=6)
    assert given.limits.unverified_waits == 6


def test_max_unverified_waits_must_be_below_max_requests() -> None:
    """At max_requests, requests without a credential could take every one."""
    assert_single_problem(
        with_text("limits: {max_requests: 7, max_unverified_waits: 7}"),
        13,
        "limits.max_unverified_waits",
        "must be below max_requests (7)",
    )
    assert_single_problem(
        with_text("limits: {max_unverified_waits: 0}"),
        13,
        "limits.max_unverified_waits",
        "must be at least 1",
    )


def test_unknown_key_in_limits() -> None:
    assert_single_problem(
        with_text("limits: {max_sockets: 10}"),
        13,
        "limits.max_sockets",
        "(allowed: body_timeout_s, header_timeout_s, max_connections, max_requests, "
        "max_unverified_waits)",
    )


def test_limits_must_be_a_mapping() -> None:
    assert_single_problem(with_text("limits: [1]"), 13, "limits", "expected a mapping, got a list")


def test_an_empty_pool_is_refused() -> None:
    text = edit("connect_timeout_s: 1}", "connect_timeout_s: 1, pool: {pass_through: 0}}")
    assert_single_problem(
        text, 6, "upstreams.supplier.pool.pass_through", "must be at least 1, got 0"
    )


def test_unknown_key_in_a_pool() -> None:
    text = edit("connect_timeout_s: 1}", "connect_timeout_s: 1, pool: {reads: 3}}")
    assert_single_problem(
        text, 6, "upstreams.supplier.pool.reads", "unknown key (allowed: fenced, pass_through)"
    )


@pytest.mark.parametrize("key", ["min_ttl_s", "max_ttl_s", "default_ttl_s"])
@pytest.mark.parametrize("null", ["null", "~", ""])
def test_a_null_lease_ttl_is_refused_naming_its_key_and_line(key: str, null: str) -> None:
    """An empty value is a mistake, never "the default"."""
    text = edit(
        "leases: {min_ttl_s: 1, max_ttl_s: 300, default_ttl_s: 30}",
        "leases:\n  min_ttl_s: 1\n  max_ttl_s: 300\n  default_ttl_s: 30",
    )
    text = edit(f"  {key}: ", f"  {key}: {null} #", text)
    line = 5 + ["min_ttl_s", "max_ttl_s", "default_ttl_s"].index(key)
    assert_single_problem(text, line, f"leases.{key}", "expected a number, got null")


def test_a_mistyped_fence_is_one_problem_not_also_the_defaults() -> None:
    # `fence: maybe` fails its check and stands in as `required`; the route's missing
    # resource is then no second error about a fence the file never asked for.
    text = edit('    resource: "supplier:{sku}"\n    fence: required\n', "    fence: maybe\n")
    assert_single_problem(text, 11, "routes[0].fence", "expected one of required, none")


def test_a_mistyped_idempotency_flag_is_one_problem_not_also_the_defaults() -> None:
    text = with_route_keys("idempotency: {required: 7}", "upstream_idempotent: true")
    assert_single_problem(text, 13, "routes[0].idempotency.required", "expected true or false")


def test_a_mistyped_idempotency_flag_is_one_problem_under_a_probe_too() -> None:
    text = with_route_keys(
        "idempotency: {required: yes please}",
        "reconcile:",
        "  probe: {path: '/orders/{idempotency_key}'}",
        "  committed: [200]",
        "  not_committed: [404]",
    )
    assert_single_problem(text, 13, "routes[0].idempotency.required", "expected true or false")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (edit("    upstream: supplier", "   upstream: supplier"), 9, "indented differently"),
        (with_route_keys("  max_in_flight: 2"), 13, "indent the key under its parent"),
        (edit("port: 8080}", "port: 8080"), 3, "mapping is not closed"),
        (edit("methods: [POST]", "methods: [POST"), 10, "list is not closed"),
        (edit("resource: ", "resource: a: "), 11, "quote a value that holds ': '"),
        (edit("fence: required", 'fence: "required'), 13, "a closing quote is missing"),
        (with_text("\tversion: 1"), 13, "indent with spaces"),
    ],
)
def test_malformed_yaml_names_its_line_and_what_was_expected(
    text: str, line: int, words: str
) -> None:
    problems = problems_of(text)
    assert [(p.line, p.key) for p in problems] == [(line, "<file>")], problems
    assert words in problems[0].message, problems[0].message
    # The project's words, not PyYAML's parser states.
    assert "<block" not in problems[0].message and "token" not in problems[0].message


def test_an_unknown_key_near_a_valid_one_suggests_it() -> None:
    text = edit("timeout_s: 5", "timout_s: 5")
    assert_single_problem(
        text, 6, "upstreams.supplier.timout_s", "unknown key: did you mean 'timeout_s'?"
    )


def test_an_unknown_key_near_none_lists_the_allowed_ones() -> None:
    problems = problems_of(with_text("colour: blue"))
    assert "did you mean" not in problems[0].message
    assert problems[0].message.startswith("unknown key (allowed: admin_token_env,")
