"""Refusals counted in memory between two writes of `refusal_counts` (issue 8, item 1).

A refusal anyone can cause without a valid credential (`Store.counted`) is one more in
a count, not a row of its own. Writing each one at once would still cost a write
transaction per junk request: on SQLite every writer waits for that, and on
PostgreSQL each update leaves a dead row version behind until a vacuum, so a flood of
them grows the store anyway. So they are added up here, without I/O, and the store
writes the sums in one transaction at a time (`Store.flush_refusal_counts`): every
second, before any listing of refusals, and at close.

Bounded like the table: at most `max_kinds` keys a code, then that code's '<other>'
key takes the rest, so no traffic can make this grow past (max_kinds + 1) keys a code.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

OTHER_PATH = "<other>"


@dataclass(frozen=True)
class CountKey:
    """What a counted refusal is kept by; '' stands for no route or no resource."""

    code: str
    route: str
    resource: str
    method: str
    path: str

    def other(self) -> CountKey:
        """The code's catch-all key, for a kind past the bound."""
        return CountKey(self.code, "", "", "*", OTHER_PATH)


class RefusalTally:
    def __init__(self, max_kinds: int) -> None:
        self.max_kinds = max_kinds
        self._counts: Counter[CountKey] = Counter()
        self._kinds_of_code: Counter[str] = Counter()

    def add(self, key: CountKey, n: int = 1) -> None:
        if key not in self._counts and key != key.other():
            if self._kinds_of_code[key.code] >= self.max_kinds:
                key = key.other()
            else:
                self._kinds_of_code[key.code] += 1
        self._counts[key] += n

    def take(self) -> dict[CountKey, int]:
        """Everything counted so far; the tally starts again from nothing."""
        taken = dict(self._counts)
        self._counts.clear()
        self._kinds_of_code.clear()
        return taken

    def give_back(self, taken: dict[CountKey, int]) -> None:
        """Counts a failed write took: counted again, still within the bound."""
        for key, n in taken.items():
            self.add(key, n)

    def __len__(self) -> int:
        return len(self._counts)
