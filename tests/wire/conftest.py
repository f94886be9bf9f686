"""The wire tests' processes: the recording upstream and `fenceproxy serve`, started once
per module on free ports of 127.0.0.1, always stopped."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.processes import ManagedProcess, free_port
from tests.integration.processes.conftest import http_call

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN_ENV = "FENCEPROXY_ADMIN_TOKEN"
STARTUP_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.01
MAX_BODY_BYTES = 8 * 1_048_576
UPSTREAM_TIMEOUT_S = 10.0
# Acquires and admin calls on a shared 2-core machine, during a long search: a slow
# answer is not what these tests look for, a lost one would end the search.
CONTROL_TIMEOUT_S = 30.0

CONFIG = """\
version: 1
listen: {{host: 127.0.0.1, port: {proxy_port}}}
store: sqlite:///{store_path}
admin_token_env: {admin_token_env}
leases: {{min_ttl_s: 0.5, max_ttl_s: 3600, default_ttl_s: 3600}}
# Every example takes a lease of its own: no quota may end a long search.
quotas: {{live_leases: 0, acquires_per_s: 0, burst: 1}}
upstreams:
  recorder: {{url: "http://127.0.0.1:{upstream_port}", timeout_s: {timeout_s},
              connect_timeout_s: 1}}
routes:
  - name: fenced
    upstream: recorder
    match: {{methods: [POST, PUT, PATCH, DELETE], path: "/f/{{rid}}/{{rest:.*}}"}}
    resource: "wire:{{rid}}"
    fence: required
    forward_fence_headers: true
    max_in_flight: 4
    max_body_bytes: {max_body}
    idempotency: {{required: false, retain_s: 3600}}
  - name: keyed
    upstream: recorder
    match: {{methods: [POST], path: "/k/{{rid}}"}}
    resource: "key:{{rid}}"
    fence: required
    forward_fence_headers: true
    idempotency: {{required: true, retain_s: 3600}}
    reconcile:
      probe: {{method: GET, path: "/probe/{{idempotency_key}}"}}
      committed: ["200"]
      not_committed: ["404"]
      settle_s: {timeout_s}
  - name: passthrough
    upstream: recorder
    match: {{methods: [GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS], path: "/p/{{rest:.*}}"}}
    fence: none
    max_body_bytes: {max_body}
"""


@dataclass
class WireStack:
    proxy_port: int
    upstream_port: int
    admin_token: str
    directory: Path
    proxy: ManagedProcess
    upstream: ManagedProcess

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def authority(self) -> bytes:
        return f"127.0.0.1:{self.upstream_port}".encode()

    def new_token(self) -> str:
        return uuid.uuid4().hex

    def script(self, token: str, script: dict[str, Any]) -> None:
        path = self.directory / "scripts" / f"{token}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(script))
        os.replace(temporary, path)

    def received(self, token: str) -> list[dict[str, Any]]:
        """The recording upstream's log of the requests that carried `token`, decoded."""
        return self._logged(token)

    def probes_of(self, effect_id: str) -> list[dict[str, Any]]:
        """The unscripted requests (the proxy's probes) naming this effect."""
        return self._logged(f"_effect-{effect_id}")

    def _logged(self, folder: str) -> list[dict[str, Any]]:
        paths = sorted((self.directory / "log" / folder).glob("*.json"), key=lambda p: int(p.stem))
        return [decode_record(json.loads(p.read_text())) for p in paths]

    def acquire(self, resource: str) -> tuple[str, int]:
        result = http_call(
            self.proxy_url,
            "POST",
            "/_fence/v1/leases",
            json_body={"resource": resource, "holder": "wire-worker"},
            timeout_s=CONTROL_TIMEOUT_S,
        )
        assert result.status == 201, result
        return result.body["token"], result.body["epoch"]

    def admin(
        self, method: str, path: str, body: Any = None, accept: tuple[int, ...] = (200,)
    ) -> Any:
        result = http_call(
            self.proxy_url,
            method,
            path,
            json_body=body,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout_s=CONTROL_TIMEOUT_S,
        )
        assert result.status in accept, result
        return result.body

    def log_tails(self) -> list[tuple[str, str]]:
        return [
            ("fenceproxy log", self.proxy.log_tail(80)),
            ("recording upstream log", self.upstream.log_tail(40)),
        ]


def decode_record(record: dict[str, Any]) -> dict[str, Any]:
    def raw(text: str) -> bytes:
        return base64.b64decode(text)

    return {
        "method": raw(record["method"]),
        "target": raw(record["target"]),
        "headers": [(raw(n), raw(v)) for n, v in record["headers"]],
        "body": raw(record["body"]),
        "raw": raw(record["raw"]),
        "complete": record["complete"],
    }


def wait_for(what: str, condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WireStack]:
    directory = tmp_path_factory.mktemp("wire")
    upstream_port = free_port()
    proxy_port = free_port()
    admin_token = secrets.token_urlsafe(24)
    config_path = directory / "fenceproxy.yaml"
    config_path.write_text(
        CONFIG.format(
            proxy_port=proxy_port,
            upstream_port=upstream_port,
            store_path=directory / "fence.db",
            admin_token_env=ADMIN_TOKEN_ENV,
            timeout_s=UPSTREAM_TIMEOUT_S,
            max_body=MAX_BODY_BYTES,
        )
    )
    with contextlib.ExitStack() as processes:
        upstream = processes.enter_context(
            ManagedProcess(
                "recording upstream",
                [
                    sys.executable,
                    "-m",
                    "tests.wire.recording_upstream",
                    "--port",
                    str(upstream_port),
                    "--dir",
                    str(directory),
                ],
                log_path=directory / "upstream.log",
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        proxy = processes.enter_context(
            ManagedProcess(
                "fenceproxy",
                [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config_path)],
                log_path=directory / "proxy.log",
                env={**os.environ, ADMIN_TOKEN_ENV: admin_token},
                cwd=PROJECT_ROOT,
                start_new_session=True,
            )
        )
        wait_for("the recording upstream", (directory / "ready").exists, STARTUP_TIMEOUT_S)
        proxy.wait_http_ok(f"http://127.0.0.1:{proxy_port}/_fence/healthz", STARTUP_TIMEOUT_S)
        yield WireStack(proxy_port, upstream_port, admin_token, directory, proxy, upstream)
