"""Named pause points on the fenced request path (the proxy's and its store's), for
tests that pause a replica at an exact place with real processes.

`FENCEPROXY_FAILPOINTS` names the enabled points, comma-separated; `NAME:once` fires
only the first time that point is reached. `serve` reads it once as it starts. At an
enabled point the process stops itself (SIGSTOP), as a GC or VM pause would stop it,
so the test knows where it is paused (/proc/PID/stat says `T`) and goes on with
SIGCONT. Off (the variable unset or empty), each point costs one frozenset test. Here,
below the store and the proxy, so that both reach their points through one switch; the
stopping itself is the caller's (`serve` passes it to `configure`), so this module does
no I/O, as the rest of `core/`.

The points, in the order a fenced request reaches them:

* `mid_batch`: in the store (PostgreSQL's group commit, store/postgres.py), a batch's
  write has run and the next, a write of a resource (an admission, a receipt, a
  lease's), has not, the transaction open: the locks of the writes run so far held,
  nothing of the batch committed, the writes after it still to be judged, each at its
  own time. Not before a write that names no resource: the replica's own bookkeeping
  (its heartbeat, its refusal counts) batches as it starts, before any request.
* `admitted`: the admission's COMMIT answer has arrived (the effect is DISPATCHING),
  before anything else is done.
* `before_send`: the send deadline was checked and passed and the upstream connection
  is had, right before the request's first byte is written.
* `cancelled`: the request's handler was cancelled while it dispatched (`serve` past
  a stop's grace), before the receipt that records the effect UNKNOWN is written.
* `sent`: the dispatch is over (the upstream's answer read, or its failure known),
  before its receipt is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

ENV = "FENCEPROXY_FAILPOINTS"
ADMITTED = "admitted"
BEFORE_SEND = "before_send"
CANCELLED = "cancelled"
SENT = "sent"
MID_BATCH = "mid_batch"
NAMES = frozenset({MID_BATCH, ADMITTED, BEFORE_SEND, CANCELLED, SENT})
ONCE = "once"


def _nothing() -> None:
    """Before `configure`: no point is enabled, so nothing is ever stopped."""


# What is enabled, of it what fires only once, and how the process stops at a point:
# set by `configure`, as `serve` starts.
_enabled: frozenset[str] = frozenset()
_once: frozenset[str] = frozenset()
_stop: Callable[[], None] = _nothing


class FailpointError(ValueError):
    """`FENCEPROXY_FAILPOINTS` names a point that does not exist, or a bad modifier."""


def parse(spec: str) -> tuple[frozenset[str], frozenset[str]]:
    """The enabled points and those of them that fire once, from the variable's value."""
    enabled: set[str] = set()
    every_time: set[str] = set()
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, modifier = item.partition(":")
        if name not in NAMES:
            raise FailpointError(
                f"{ENV}: no failpoint {name!r} (there are: {', '.join(sorted(NAMES))})"
            )
        if sep and modifier != ONCE:
            raise FailpointError(f"{ENV}: {item!r}: the only modifier is ':{ONCE}'")
        enabled.add(name)
        if not sep:
            every_time.add(name)
    # Named both with ':once' and without, a point fires every time.
    return frozenset(enabled), frozenset(enabled - every_time)


def configure(environ: Mapping[str, str], stop: Callable[[], None]) -> frozenset[str]:
    """Read `FENCEPROXY_FAILPOINTS` (once, as the process starts); the enabled points,
    at each of which `stop` is called."""
    global _enabled, _once, _stop
    _enabled, _once = parse(environ.get(ENV, ""))
    _stop = stop
    return _enabled


def reach(name: str) -> None:
    """The request is at point `name`: stop this process here if the point is enabled."""
    global _enabled
    if name not in _enabled:
        return
    if name in _once:
        _enabled = _enabled - {name}
    _stop()
