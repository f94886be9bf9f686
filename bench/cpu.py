"""CPU accounting for a benchmark window, from /proc (Linux).

A `CpuSnapshot` holds, at one moment, the CPU time (user + system) each named
group of processes has used, the load generator's own, and the machine's busy
and total time. The difference of two snapshots says where the cores went
during the window between them, in percent of one core (200% = both cores of a
2-core machine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LOAD_GENERATOR = "load generator"


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of `pid` in seconds; None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after it are fixed.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_and_total_s() -> tuple[float, float]:
    """CPU seconds of all cores so far: (busy, total); idle and iowait are not busy."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def pids_named(command: str) -> list[int]:
    """Every process whose command name is `command` (e.g. all "postgres" processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="utf-8") as comm:
                if comm.read().strip() == command:
                    found.append(int(entry))
        except OSError:
            continue
    return found


@dataclass(frozen=True)
class CpuSnapshot:
    at: float
    groups: dict[str, dict[int, float]]  # group -> pid -> CPU seconds
    machine_busy_s: float
    machine_total_s: float

    @classmethod
    def take(cls, groups: Mapping[str, Sequence[int]]) -> CpuSnapshot:
        taken: dict[str, dict[int, float]] = {}
        for name, pids in groups.items():
            taken[name] = {}
            for pid in pids:
                seconds = process_cpu_s(pid)
                if seconds is not None:
                    taken[name][pid] = seconds
        taken[LOAD_GENERATOR] = {os.getpid(): time.process_time()}
        busy, total = machine_busy_and_total_s()
        return cls(time.monotonic(), taken, busy, total)


@dataclass(frozen=True)
class CpuUsage:
    """Percent of one core, per group, over a window; and the machine's busy share."""

    window_s: float
    percent: dict[str, float]
    machine_busy_percent: float  # of all cores together: 100 = every core busy
    cores: int

    def as_json(self) -> dict[str, object]:
        return {
            "window_s": round(self.window_s, 3),
            "percent_of_one_core": {k: round(v, 1) for k, v in self.percent.items()},
            "machine_busy_percent": round(self.machine_busy_percent, 1),
            "cores": self.cores,
        }


def usage(before: CpuSnapshot, after: CpuSnapshot) -> CpuUsage:
    window = max(after.at - before.at, 1e-9)
    percent = {}
    for name, pids in after.groups.items():
        earlier = before.groups.get(name, {})
        # A process that started inside the window counts from zero.
        used = sum(seconds - earlier.get(pid, 0.0) for pid, seconds in pids.items())
        percent[name] = 100 * used / window
    total = after.machine_total_s - before.machine_total_s
    busy = after.machine_busy_s - before.machine_busy_s
    cores = len(os.sched_getaffinity(0))
    return CpuUsage(window, percent, 100 * busy / total if total > 0 else 0.0, cores)
