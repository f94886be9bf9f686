"""`fenceproxy serve` checks its PostgreSQL server (a standby, a read-only database, a
transaction pooler with the statement cache on) once, as the store opens, before its
banner: not once more before opening it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import store.postgres
from policies.model import StorePool
from proxy import cli, connections
from support.processes import free_port


@pytest.mark.parametrize("backend", ["postgresql"])
def test_serve_checks_the_server_once(
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    checked: list[str] = []
    real_check = store.postgres.check_server

    async def counted_check(url: str, pool: StorePool, queries: Any) -> None:
        checked.append(url)
        await real_check(url, pool, queries)

    async def started_and_stopped(app: web.Application, **options: Any) -> None:
        """The app's start (its store opened) and stop, without listening."""
        runner = web.AppRunner(app)
        await runner.setup()
        options["on_listening"]()
        await runner.cleanup()

    monkeypatch.setattr(store.postgres, "check_server", counted_check)
    monkeypatch.setattr(connections, "serve", started_and_stopped)
    config = tmp_path / "proxy.yaml"
    config.write_text(
        f"version: 1\nstore: {store_url}\nlisten: {{port: {free_port()}}}\n"
        'upstreams:\n  supplier: {url: "http://127.0.0.1:9"}\n'
        "routes:\n  - name: put-x\n    upstream: supplier\n"
        '    match: {methods: [PUT], path: "/x/{id}"}\n    resource: "x:{id}"\n'
    )
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--config", str(config), "--state-dir", str(tmp_path / "state")])
    assert exited.value.code in (0, None)
    assert checked == [store_url]
    assert "fenceproxy on http" in capsys.readouterr().out  # the banner, once started
