"""How the CLI prints: tables for people, `--json` for programs; every stored string
escaped before it reaches a terminal."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from core.leasing_advice import Advice, recommendation
from proxy.terminal import printable


def emit(args: argparse.Namespace, data: Any, rows: list[list[str]], header: list[str]) -> None:
    """`data` as JSON under --json; otherwise `rows` as a table under `header`."""
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    # Cells hold stored strings (paths, reasons, names sent by anyone): escaped.
    shown = [[printable(table_cell(cell)) for cell in row] for row in [header, *rows]]
    widths = [max(len(cell) for cell in column) for column in zip(*shown, strict=True)]
    for row in shown:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def table_cell(value: object) -> str:
    """A table cell: an absent value is "-", as in every other column, never "None"."""
    return "-" if value is None else str(value)


def local_time(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


CHART_WIDTH = 40


def print_advice(advice: Advice) -> None:
    for group in advice.groups:
        data = group.as_json()
        print(f"{printable(group.resource)}: {group.stats.turns} measured turn(s)")
        rows = [["turns", str(group.stats.turns)]]
        turn_s = data["turn_s"]
        if isinstance(turn_s, dict):
            rows.append(["turn_s", "  ".join(f"{k} {v:g}" for k, v in turn_s.items())])
        shortest = data["shortest_lease_s"]
        if isinstance(shortest, dict):
            rows.append(
                [
                    "shortest lease for a false-expiry rate of",
                    "  ".join(f"{k}: {_seconds_text(v)}" for k, v in shortest.items()),
                ]
            )
        rows.append(["suggested_ttl_s", _seconds_text(data["suggested_ttl_s"])])
        delay = data["detection_delay_s"]
        if isinstance(delay, dict):
            rows.append(
                [
                    "detection delay (crash)",
                    f"{delay['expected']:g} s on average = {delay['lease_s']:g} - "
                    f"{delay['turn_s']:g}/2 + {delay['poll_interval_s']:g}/2",
                ]
            )
        rows.append(
            [
                "expired",
                f"{group.expired}: holder came back {group.came_back}, "
                f"never came back {group.expired - group.came_back}",
            ]
        )
        ttls = data["ttls_in_use_s"]
        if isinstance(ttls, dict):
            rows.append(["ttls in use", f"p50 {ttls['p50']:g} s, min {ttls['min']:g} s"])
        print_table(rows, ["", ""], indent="  ")
        if group.stats.curve:
            print("  false-expiry curve: share of turns longer than the lease")
            width = max(len(f"{lease:g}") for lease, _ in group.stats.curve)
            for lease, share in group.stats.curve:
                bar = "#" * round(share * CHART_WIDTH)
                print(f"  {lease:>{width}g} s |{bar:<{CHART_WIDTH}}| {share * 100:5.1f}%")
        for warning in group.warnings:
            print(f"  warning: {printable(warning)}")
        print(f"  => {recommendation(group)}")
        print()
    if advice.routes:
        rows = []
        for route in advice.routes:
            tail = route.tail()
            measured = (
                [f"{tail['p50']:g}", f"{tail['p99']:g}", f"{tail['max']:g}"]
                if tail
                else ["-", "-", "-"]
            )
            check = "; ".join(route.warnings()) or "ok"
            rows.append(
                [route.name, str(len(route.latencies)), *measured, f"{route.timeout_s:g}", check]
            )
        print_table(rows, ["route", "requests", "p50_s", "p99_s", "max_s", "timeout_s", "check"])
    for problem in advice.problems:
        print(f"problem: {printable(problem)}")


def _seconds_text(value: object) -> str:
    return "-" if value is None else f"{value:g}"


def print_table(rows: list[list[str]], header: list[str], indent: str = "") -> None:
    shown = [
        [printable(cell) for cell in row] for row in ([header, *rows] if any(header) else rows)
    ]
    widths = [max(len(cell) for cell in column) for column in zip(*shown, strict=True)]
    for row in shown:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(indent + line.rstrip())
