"""The simulated upstream: a plain object that keeps its own records.

It is the ground truth the invariants are checked against, never the proxy's
word. It counts what it applied per (resource, idempotency key) and per effect
(identified by the Fence-Effect-Id it was sent with). An upstream that
deduplicates by key (a route flagged `upstream_idempotent`) applies a key once
and answers a repeat with the original result, or 422 for another payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Landing(Enum):
    APPLIED = "applied"
    DEDUPLICATED = "deduplicated"  # an upstream that deduplicates had the key already
    MISMATCH = "mismatch"  # ... had the key already, for another payload
    REJECTED = "rejected"  # refused the request; nothing changed


@dataclass
class SimUpstream:
    # (resource, key) -> sequence numbers of the effects whose request was applied
    applied_keys: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    key_fingerprints: dict[tuple[str, str], str] = field(default_factory=dict)
    applied_effects: set[int] = field(default_factory=set)
    requests: int = 0

    def receive(
        self,
        seq: int,
        resource: str,
        key: str | None,
        fingerprint: str,
        deduplicates: bool,
        commits: bool,
    ) -> Landing:
        """A request arrives; `commits` is whether this upstream would apply it."""
        self.requests += 1
        if key is not None and deduplicates and (resource, key) in self.applied_keys:
            if self.key_fingerprints[(resource, key)] != fingerprint:
                return Landing.MISMATCH
            return Landing.DEDUPLICATED
        if not commits:
            return Landing.REJECTED
        self.applied_effects.add(seq)
        if key is not None:
            self.applied_keys.setdefault((resource, key), []).append(seq)
            self.key_fingerprints.setdefault((resource, key), fingerprint)
        return Landing.APPLIED

    def applications(self, resource: str, key: str) -> int:
        return len(self.applied_keys.get((resource, key), ()))

    def holds(self, seq: int, resource: str, key: str | None) -> bool:
        """What a lookup finds: the operation by its key, or a keyless effect by its id."""
        if key is not None:
            return (resource, key) in self.applied_keys
        return seq in self.applied_effects
