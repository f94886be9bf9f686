"""The admin API's and the CLI's JSON of the store's values (store/types.py): how
they are shown is the proxy's business, not the store's."""

from __future__ import annotations

from typing import Any

from store import LeaseEntry, LeaseView, Replica


def lease_view_json(view: LeaseView) -> dict[str, Any]:
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
    return {
        "instance_id": replica.instance_id,
        "version": replica.version,
        "started_at": replica.started_at,
        "seen_at": replica.seen_at,
        "last_sweep_at": replica.last_sweep_at,
        "last_probe_at": replica.last_probe_at,
    }


def lease_entry_json(lease: LeaseEntry) -> dict[str, Any]:
    return {
        "resource": lease.resource,
        "epoch": lease.epoch,
        "holder": lease.holder,
        "client": lease.client,
        "granted_at": lease.granted_at,
        "expires_at": lease.expires_at,
        "ended_at": lease.ended_at,
        "end_reason": lease.end_reason,
        "came_back_at": lease.came_back_at,
    }
