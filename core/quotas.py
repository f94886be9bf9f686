"""Quotas on acquires: how many a subject may make per second, how many live leases it
may hold. Pure like the rest of core: `now` is passed in, nothing is read or written.

The acquire rate is a token bucket per quota subject, kept in each process's memory:
a subject may acquire `burst` times at once, then `acquires_per_s` times a second.
With N replicas a subject can therefore get up to N times that (each replica has its
own buckets); sharing them would cost a store write per acquire, which is what a
rate limit is there to spare.

The buckets are bounded whatever the traffic: without `auth:` the subjects are the
holder names requests carry, which anyone may invent. At most `max_subjects` are
tracked. A full bucket says nothing a new one would not, so full ones are forgotten
first; only when every tracked subject acquired too recently to be full again is the
least recently seen one forgotten, which at worst gives it a fresh burst.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass

# About 200 bytes a subject (a holder name is at most 128 characters): under 1 MB.
MAX_TRACKED_SUBJECTS = 4096
# How many of the least recently used buckets a new subject looks at for full ones.
FULL_SCAN = 64


def retry_after_s(wait_s: float) -> int:
    """`Retry-After` for a wait: whole seconds, rounded up, at least 1 (0 would invite
    an immediate retry that is refused again)."""
    return max(1, math.ceil(wait_s))


@dataclass
class _Bucket:
    # Its own rate and burst: subjects may have quotas of their own (per-client ones).
    rate: float
    burst: int
    tokens: float
    at: float  # when `tokens` was last brought up to date

    def refill(self, now: float) -> None:
        # A clock that went backwards adds nothing (and takes nothing away).
        elapsed = max(0.0, now - self.at)
        self.tokens = min(float(self.burst), self.tokens + elapsed * self.rate)
        self.at = max(self.at, now)

    def full(self) -> bool:
        return self.tokens >= self.burst


class AcquireRate:
    """Token buckets by quota subject, at most `max_subjects` of them."""

    def __init__(self, max_subjects: int = MAX_TRACKED_SUBJECTS) -> None:
        assert max_subjects >= 1
        self.max_subjects = max_subjects
        # Least recently used first.
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, subject: str, rate: float, burst: int, now: float) -> float:
        """Take one acquire from `subject`'s bucket: 0.0 if it may acquire now, else the
        seconds until it may (nothing taken). `rate` 0 is unlimited and tracks nothing."""
        if rate <= 0:
            return 0.0
        bucket = self._buckets.get(subject)
        if bucket is None:
            self._make_room(now)
            bucket = self._buckets[subject] = _Bucket(rate, burst, float(burst), now)
        else:
            self._buckets.move_to_end(subject)
            bucket.refill(now)
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / rate

    def _make_room(self, now: float) -> None:
        # Full buckets go first, looked for among the least recently used (the
        # likeliest to be full again), a bounded number of them so that a flood of new
        # names costs a constant each; then, if there is still no room, the least
        # recently used goes anyway.
        for subject, bucket in list(itertools.islice(self._buckets.items(), FULL_SCAN)):
            bucket.refill(now)
            if bucket.full():
                del self._buckets[subject]
        while len(self._buckets) >= self.max_subjects:
            self._buckets.popitem(last=False)

    def __len__(self) -> int:
        return len(self._buckets)
