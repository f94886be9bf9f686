"""The keys of the policy file's `upstreams` and `routes`, each declared once (see
policies/keys.py): policies/loading_routes.py reads them, policies/model.py takes its
defaults from them, and the configuration reference prints them."""

from __future__ import annotations

from policies.keys import (
    DAY_S,
    FLAG,
    ITEMS,
    STATUSES,
    TEXT,
    Choice,
    Key,
    Number,
    block,
    required,
)

# --- upstreams.NAME -------------------------------------------------------------------------

URL = required(
    "url",
    TEXT,
    "`http://` or `https://`; an https upstream's certificate is always verified (its "
    "chain and that it names the URL's host)",
)
TIMEOUT_S = Key(
    "timeout_s",
    Number(minimum=0.001),
    10.0,
    "seconds a request may take upstream; past it a fenced write's outcome is unknown. "
    "A fenced write needs at least this much left on its lease (`lease_too_short`)",
)
CONNECT_TIMEOUT_S = Key(
    "connect_timeout_s",
    Number(minimum=0.001),
    2.0,
    "seconds to connect (and to wait for a pooled connection); past it nothing was "
    "sent: `502 upstream_unreachable`. At most `timeout_s`",
)
SEND_WINDOW_S = Key(
    "send_window_s",
    Number(minimum=0.001),
    5.0,
    "seconds after a fenced write's admission within which it may still be sent, "
    "counted from before the admission (its wait for a store connection included) and "
    "checked on the proxy's own monotonic clock once it has a connection, right "
    "before the first byte; past it nothing is sent (`502 upstream_unreachable`, "
    "effect `NOT_SENT`), so a replica paused after admitting cannot land a write "
    "another replica already settled. Other replicas take the write for in flight "
    "until `send_window_s` + `timeout_s` + 2 s after its admission. At least "
    "`connect_timeout_s`, at most 60",
    shown="5, or `connect_timeout_s` if longer",
)
POOL_FENCED = Key("fenced", Number(minimum=1, integer=True), 256, "connections for fenced routes")
POOL_PASS_THROUGH = Key(
    "pass_through",
    Number(minimum=1, integer=True),
    256,
    "connections for `fence: none` routes; kept apart from `fenced` so slow reads cannot "
    "starve fenced writes",
)
POOL = block("pool", (POOL_FENCED, POOL_PASS_THROUGH), "connections per process to this upstream")
CA_BUNDLE = Key(
    "ca_bundle",
    TEXT,
    None,
    "an https upstream's certificate must chain to a CA in this PEM file (only these "
    "CAs); path relative to the policy file's folder; refused on an http URL",
    shown="none: the system's trust store",
)
UPSTREAM = block(
    "NAME",
    (URL, TIMEOUT_S, CONNECT_TIMEOUT_S, SEND_WINDOW_S, POOL, CA_BUNDLE),
    "an upstream",
)

# --- routes[] -------------------------------------------------------------------------------

NAME = required("name", TEXT, "the route's name, in logs, metrics and effects")
UPSTREAM_NAME = required("upstream", TEXT, "the name of an upstream")
METHODS = required("methods", ITEMS, "HTTP methods (GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS)")
PATH = required(
    "path",
    TEXT,
    "`{name}` one segment; `{name:int}`, `{name:uuid}`; `{name:REGEX}` (may span "
    "segments, e.g. `{rest:.*}`); matched against the decoded path, where a regex's "
    "`.` matches any character (a newline from `%0A` too)",
)
MATCH = block("match", (METHODS, PATH), "what requests the route takes", shown="required")
RESOURCE = Key(
    "resource",
    TEXT,
    None,
    "the resource a write needs a lease on, rendered from path parameters: 1 to 256 "
    "characters of `A-Z a-z 0-9 . _ : @ / + = -`; a parameter may not hold its "
    "separators (see [routes](routes.md))",
    shown="required when fenced",
)
FENCE = Key(
    "fence",
    Choice(("required", "none")),
    "required",
    "`required`: a write needs a live lease's token; `none`: plain pass-through, no "
    "token, nothing recorded",
)
FORWARD_FENCE_HEADERS = Key(
    "forward_fence_headers",
    FLAG,
    False,
    "send `Fence-Epoch`, `Fence-Resource`, `Fence-Effect-Id` upstream (workers always get them)",
)
MAX_BODY_BYTES = Key(
    "max_body_bytes",
    Number(minimum=0, integer=True),
    1_048_576,
    "larger bodies get `413 payload_too_large` before anything is read past the limit",
)
MAX_IN_FLIGHT = Key(
    "max_in_flight",
    Number(minimum=1, integer=True),
    1,
    "effects of one resource being forwarded at once",
)
IDEMPOTENCY_REQUIRED = Key(
    "required",
    FLAG,
    False,
    "`true`: a write without `Idempotency-Key` is `400 missing_idempotency_key`",
)
RETAIN_S = Key(
    "retain_s",
    Number(minimum=1),
    DAY_S,
    "seconds a key and its response are kept after its effect settled",
)
IDEMPOTENCY = block("idempotency", (IDEMPOTENCY_REQUIRED, RETAIN_S), "the `Idempotency-Key` rules")
COMMITTED = Key("committed", STATUSES, ("2xx",), "statuses that prove the write applied")
NOT_COMMITTED = Key(
    "not_committed",
    STATUSES,
    ("4xx",),
    "statuses that prove it was not applied (the key is freed)",
)
UNKNOWN = Key(
    "unknown",
    STATUSES,
    ("408", "5xx"),
    "statuses that prove nothing (the effect is in doubt, the resource blocked)",
)
OUTCOMES = block(
    "outcomes",
    (COMMITTED, NOT_COMMITTED, UNKNOWN),
    'what an upstream status proves; an exact code (`"404"`) beats a class (`"4xx"`); '
    "anything unmapped is `unknown`",
)
PROBE_METHOD = Key("method", Choice(("GET", "HEAD")), "GET", "`GET` or `HEAD`")
PROBE_PATH = required(
    "path",
    TEXT,
    "rendered from the effect's path parameters and `{idempotency_key}` (which needs "
    "`idempotency.required: true`)",
)
PROBE = block(
    "probe", (PROBE_METHOD, PROBE_PATH), "the request that asks the upstream", shown="required"
)
PROBE_COMMITTED = required("committed", STATUSES, "probe statuses that prove the write applied")
PROBE_NOT_COMMITTED = required(
    "not_committed",
    STATUSES,
    "probe statuses that prove it was not applied (believed only after `settle_s`)",
)
SETTLE_S = Key(
    "settle_s",
    Number(),
    None,
    'how long after dispatch a "not committed" probe answer is believed, dispatch being '
    "the latest a write may have been sent (its admission plus the upstream's "
    "`send_window_s`, or its lost answer's receipt if earlier). Never below the "
    "upstream's `timeout_s` (refused: a write the proxy gave up on may still land); "
    "size it as the timeout plus the slowest the upstream has been seen to apply a write",
    shown="the upstream's `timeout_s`",
)
ATTEMPTS = Key(
    "attempts",
    Number(minimum=1, integer=True),
    5,
    'inconclusive probes before the effect waits for an operator (an early "not '
    'found" inside the window does not count)',
)
RECONCILE = block(
    "reconcile",
    (PROBE, PROBE_COMMITTED, PROBE_NOT_COMMITTED, SETTLE_S, ATTEMPTS),
    "how to probe an `UNKNOWN` effect (see [reconciliation](../how-to/reconciliation.md)); "
    "without it, `UNKNOWN` waits for an operator",
    shown="none",
)
UPSTREAM_IDEMPOTENT = Key(
    "upstream_idempotent",
    FLAG,
    False,
    "the upstream deduplicates by `Idempotency-Key`: the current holder may resend the "
    "same operation to settle an `UNKNOWN` one (needs `idempotency.required: true`)",
)
ROUTE = block(
    "routes[]",
    (
        NAME,
        UPSTREAM_NAME,
        MATCH,
        RESOURCE,
        FENCE,
        FORWARD_FENCE_HEADERS,
        MAX_BODY_BYTES,
        MAX_IN_FLIGHT,
        IDEMPOTENCY,
        OUTCOMES,
        RECONCILE,
        UPSTREAM_IDEMPOTENT,
    ),
    "a route",
)
