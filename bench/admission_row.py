"""µs of CPU to turn the admission's row into the records core/fencing.py decides on.

A row as SQLite's driver answers admission_state (a token of the resource, a lease held,
an effect in doubt, a key with a kept response), timed two ways in turn, round by round:

* by name (main at a067151): the row made a dict, then the token's lease and the key's
  record each rebuilt as a dict of their own columns before their records;
* by position (store/reads.py `admission_records` now): the row's values as they are.

    .venv/bin/python -m bench.admission_row
"""

from __future__ import annotations

import argparse
import functools
import json
import sqlite3
import statistics
import time
import timeit
from typing import Any

from core.records import (
    EffectState,
    IdempotencyRecord,
    LeaseRecord,
    OpenEffect,
    ResourceState,
)
from store import rows
from store.reads import ADMISSION_COLUMNS, admission_records, tokens_lease

RESOURCE = "orders:7"
KEY = "order-7"
ROW: dict[str, Any] = {
    "now": None,
    "store_id": None,
    "t_resource": RESOURCE,
    "t_epoch": 4,
    "t_holder": "worker-1",
    "t_granted_at": 1000.25,
    "t_expires_at": 1030.25,
    "t_ended_at": None,
    "t_end_reason": None,
    "t_client": None,
    "epoch": 4,
    "epoch_floor": 0,
    "holder": "worker-1",
    "granted_at": 1000.25,
    "expires_at": 1030.25,
    "ended_at": None,
    "end_reason": None,
    "client": None,
    "open_effects": json.dumps([["eff_1", "UNKNOWN", 3, "order-6", "fp-6"]]),
    "i_fingerprint": "fp-7",
    "i_effect_id": "eff_2",
    "i_effect_state": "COMMITTED",
    "i_epoch": 4,
    "i_expires_at": 2000.5,
    "i_response_status": 201,
    "i_response_headers": json.dumps(
        {"headers": [["Content-Type", "application/json"]], "reason": "Created"}
    ),
    "i_response_body": b'{"order": 7}',
    "i_settled_by": None,
}


def driver_row() -> tuple[Any, ...]:
    """ROW as sqlite3 answers it: a tuple, its names in the cursor's description."""
    conn = sqlite3.connect(":memory:")
    names = ", ".join(f":{name} AS {name}" for name in ADMISSION_COLUMNS)
    row: tuple[Any, ...] = conn.execute(f"SELECT {names}", ROW).fetchone()
    conn.close()
    return row


# -- by name, as main at a067151 read it (store/rows.py, store/reads.py) --------------

_LEASE = ("resource", "epoch", "holder", "granted_at", "expires_at", "ended_at")
_LEASE_COLUMNS = (*_LEASE, "end_reason", "client")
_KEY_COLUMNS = tuple(name.removeprefix("i_") for name in ADMISSION_COLUMNS[-9:])


def _lease_by_name(row: dict[str, Any]) -> LeaseRecord:
    return LeaseRecord(
        resource=row["resource"],
        epoch=int(row["epoch"]),
        holder=row["holder"],
        granted_at=float(row["granted_at"]),
        expires_at=float(row["expires_at"]),
        ended_at=row["ended_at"],
        end_reason=row["end_reason"],
        client=row["client"],
    )


def _state_by_name(row: dict[str, Any], resource: str) -> ResourceState:
    return ResourceState(
        resource=resource,
        epoch=int(row["epoch"] or 0),
        lease=_lease_by_name({**row, "resource": resource}) if row["holder"] is not None else None,
        open_effects=tuple(
            OpenEffect(id=i, state=EffectState(s), epoch=int(e), idempotency_key=k, fingerprint=f)
            for i, s, e, k, f in json.loads(row["open_effects"])
        ),
        epoch_floor=int(row["epoch_floor"] or 0),
    )


def _key_by_name(row: dict[str, Any]) -> IdempotencyRecord:
    return IdempotencyRecord(
        resource=row["resource"],
        key=row["key"],
        fingerprint=row["fingerprint"],
        effect_id=row["effect_id"],
        effect_state=EffectState(row["effect_state"]),
        epoch=int(row["epoch"]),
        expires_at=float(row["expires_at"]) if row["expires_at"] is not None else None,
        response=rows.stored_response(
            int(row["response_status"]), row["response_headers"], bytes(row["response_body"])
        ),
        settled_by=row["settled_by"],
    )


def by_name(values: tuple[Any, ...]) -> object:
    row = dict(zip(ADMISSION_COLUMNS, values, strict=True))  # the connector's dict
    lease = _lease_by_name({name: row[f"t_{name}"] for name in _LEASE_COLUMNS})
    state = _state_by_name(row, RESOURCE)
    existing = _key_by_name(
        {"resource": RESOURCE, "key": KEY, **{name: row[f"i_{name}"] for name in _KEY_COLUMNS}}
    )
    return tokens_lease(lease, state), state, existing


def by_position(values: tuple[Any, ...]) -> object:
    return admission_records(values, RESOURCE, KEY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    values = driver_row()
    assert by_name(values) == by_position(values)
    ways = {"by name (main)": by_name, "by position (now)": by_position}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            seconds = timeit.timeit(
                functools.partial(way, values), timer=time.thread_time, number=args.calls
            )
            times[name].append(seconds / args.calls * 1e6)
    for name, rounds in times.items():
        spread = ", ".join(f"{t:.2f}" for t in rounds)
        print(f"{name}: median {statistics.median(rounds):.2f} µs per admission ({spread})")


if __name__ == "__main__":
    main()
