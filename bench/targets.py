"""The processes under test, each on a free port of 127.0.0.1: the demo upstream,
the plain pass-through proxy (bench/plain_proxy.py) and fenceproxy replicas on a
generated config. Each is stopped when the ExitStack it was started on closes.
"""

from __future__ import annotations

import sqlite3
import sys
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.workload import LEASE_TTL_S
from support.processes import ManagedProcess, free_port

PLAIN = "plain"
FENCED = "fenced"
TARGETS = (PLAIN, FENCED)
STARTUP_TIMEOUT_S = 30.0


def fenceproxy_config(
    port: int,
    upstream_url: str,
    store_url: str,
    pool_max: int | None = None,
    statement_cache: bool = True,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "version": 1,
        "listen": {"host": "127.0.0.1", "port": port},
        "store": store_url,
        "leases": {"min_ttl_s": 1, "max_ttl_s": LEASE_TTL_S, "default_ttl_s": 30},
        "upstreams": {"demo": {"url": upstream_url, "timeout_s": 5, "connect_timeout_s": 1}},
        "routes": [
            {
                "name": "sink",
                "upstream": "demo",
                "match": {"methods": ["POST"], "path": "/sink/{key}"},
                "resource": "bench:{key}",
                "fence": "required",
                # Each worker has a resource of its own and sends one request at a time.
                "max_in_flight": 1,
                "idempotency": {"required": True, "retain_s": 3600},
            }
        ],
    }
    if pool_max is not None:
        config["store_pool"] = {
            "min_size": 1,
            "max_size": pool_max,
            "statement_cache": statement_cache,
        }
    return config


@dataclass
class RunningTargets:
    upstream_url: str
    base_urls: dict[str, str]
    processes: list[ManagedProcess]
    fenceproxy_db: Path | None


def start_process(
    processes: ExitStack, workdir: Path, name: str, module_and_args: list[str], health_url: str
) -> ManagedProcess:
    """`python -m MODULE ARGS`, stopped when `processes` closes; returns once healthy."""
    argv = [sys.executable, "-m", *module_and_args]
    process = processes.enter_context(ManagedProcess(name, argv, log_path=workdir / f"{name}.log"))
    process.wait_http_ok(health_url, STARTUP_TIMEOUT_S)
    return process


def start_upstream(processes: ExitStack, workdir: Path) -> tuple[str, ManagedProcess]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_process(
        processes,
        workdir,
        "demo-upstream",
        [
            "demo.upstream",
            "--port",
            str(port),
            "--db",
            str(workdir / "upstream.db"),
            "--no-access-log",
        ],
        f"{url}/_demo/healthz",
    )
    return url, process


def start_fenceproxy(
    processes: ExitStack,
    workdir: Path,
    name: str,
    upstream_url: str,
    store_url: str,
    pool_max: int | None = None,
    statement_cache: bool = True,
) -> tuple[str, ManagedProcess]:
    port = free_port()
    config_path = workdir / f"{name}.yaml"
    config = fenceproxy_config(port, upstream_url, store_url, pool_max, statement_cache)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    url = f"http://127.0.0.1:{port}"
    process = start_process(
        processes,
        workdir,
        name,
        ["proxy.cli", "serve", "--config", str(config_path)],
        f"{url}/_fence/healthz",
    )
    return url, process


def start_targets(
    processes: ExitStack, workdir: Path, targets: list[str], synchronous: str
) -> RunningTargets:
    """Start the upstream and the chosen proxies; each is stopped when `processes` closes."""
    upstream_url, upstream = start_upstream(processes, workdir)
    started = [upstream]
    base_urls: dict[str, str] = {}
    if PLAIN in targets:
        port = free_port()
        base_urls[PLAIN] = f"http://127.0.0.1:{port}"
        started.append(
            start_process(
                processes,
                workdir,
                "plain-proxy",
                ["bench.plain_proxy", "--port", str(port), "--upstream", upstream_url],
                f"{base_urls[PLAIN]}/_demo/healthz",
            )
        )
    fenceproxy_db = None
    if FENCED in targets:
        fenceproxy_db = workdir / "bench.db"
        base_urls[FENCED], fenceproxy = start_fenceproxy(
            processes,
            workdir,
            "fenceproxy",
            upstream_url,
            f"sqlite:///{fenceproxy_db}?synchronous={synchronous}",
        )
        started.append(fenceproxy)
    return RunningTargets(upstream_url, base_urls, started, fenceproxy_db)


def store_durability(running: RunningTargets, synchronous: str) -> str:
    """fenceproxy's SQLite durability: the journal mode as the file records it, and the
    synchronous level the benchmark set in the store URL (a per-connection setting)."""
    if running.fenceproxy_db is None:
        return "n/a (fenceproxy not measured)"
    try:
        with closing(sqlite3.connect(f"file:{running.fenceproxy_db}?mode=ro", uri=True)) as db:
            journal_mode: str = db.execute("PRAGMA journal_mode").fetchone()[0]
    except sqlite3.Error as exc:
        journal_mode = f"unknown ({exc})"
    return f"journal_mode={journal_mode}, synchronous={synchronous}"
