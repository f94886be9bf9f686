"""Run the `fenceproxy` CLI with this process's wall clock shifted by OFFSET seconds.

    python -m tests.integration.replicas.skewed_serve OFFSET -- serve --config FILE

`time.time` (and `time.time_ns`) are replaced before anything of the proxy is
imported, so every `time.time()` in the process — the proxy's, aiohttp's `Date`
header, the SQLite store's default clock — reads the shifted clock. A replica
on PostgreSQL must not care: lease expiry is judged by the database's clock.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence


def shift_clock(offset_s: float) -> None:
    real_time = time.time
    real_time_ns = time.time_ns

    def shifted_time() -> float:
        return real_time() + offset_s

    def shifted_time_ns() -> int:
        return real_time_ns() + round(offset_s * 1e9)

    time.time = shifted_time
    time.time_ns = shifted_time_ns


def main(argv: Sequence[str]) -> None:
    if not argv:
        sys.exit("usage: python -m tests.integration.replicas.skewed_serve OFFSET -- ARGS...")
    offset_s = float(argv[0])
    rest = list(argv[1:])
    if rest[:1] == ["--"]:
        rest = rest[1:]
    # A module imported before the shift could hold the real function (`from time import time`).
    assert not any(name == "proxy" or name.startswith("proxy.") for name in sys.modules)
    shift_clock(offset_s)
    from proxy.cli import main as fenceproxy

    print(f"skewed_serve: this process's clock runs {offset_s:+g} s off", flush=True)
    fenceproxy(rest)


if __name__ == "__main__":
    main(sys.argv[1:])
