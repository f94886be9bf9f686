"""The admin API's and the CLI's JSON of the store's values (store/types.py): how
they are shown is the proxy's business, not the store's."""

from __future__ import annotations

import dataclasses
from typing import Any

from store import LeaseEntry, LeaseView, Replica


def lease_view_json(view: LeaseView) -> dict[str, Any]:
    # Spelled out: the documented key order puts next_epoch beside epoch.
    return {
        "resource": view.resource,
        "epoch": view.epoch,
        "next_epoch": view.next_epoch,
        "holder": view.holder,
        "client": view.client,
        "expires_at": view.expires_at,
        "live": view.live,
        "blocked": view.blocked,
        "in_doubt": list(view.in_doubt),
    }


def replica_json(replica: Replica) -> dict[str, Any]:
    return dataclasses.asdict(replica)


def lease_entry_json(lease: LeaseEntry) -> dict[str, Any]:
    return dataclasses.asdict(lease)
