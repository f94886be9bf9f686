"""Tracing off, the default: a proxy never imports OpenTelemetry (the `otel` extra may
not even be installed), opens no scope per request, and its steps are the work itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from core import telemetry

# The whole proxy as `serve` loads it, a fenced write's modules included, then its app.
LOADED_WITHOUT_TRACING = textwrap.dedent(
    """
    import sys
    import proxy.cli
    from core import telemetry
    from policies import parse_policy
    from proxy.app import build_app
    telemetry.install(None, log_fields=False)
    policy = parse_policy('''
    version: 1
    store: "sqlite:///unused.db"
    upstreams: {u: {url: "http://127.0.0.1:9"}}
    routes:
      - {name: r, upstream: u, match: {methods: [PUT], path: "/x/{id}"}, resource: "x:{id}"}
    ''')
    app = build_app(policy)
    print(len(app.middlewares), sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """
)


def test_a_proxy_without_tracing_imports_no_opentelemetry_and_adds_no_middleware() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOADED_WITHOUT_TRACING],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # The capacity and problem middlewares, as before tracing existed; nothing loaded.
    assert done.stdout.split(maxsplit=1) == ["2", "[]\n"], done.stderr


def test_a_process_that_installs_nothing_opens_no_scope_per_request() -> None:
    # Every command but `serve` (which calls install) runs on the module's defaults.
    done = subprocess.run(
        [sys.executable, "-c", "from core import telemetry; print(telemetry.requests_scoped())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == "False\n", done.stderr


def test_off_a_step_is_the_work_itself_and_what_it_is_about_goes_nowhere() -> None:
    assert not telemetry.requests_scoped()

    async def work() -> int:
        return 1

    coroutine = work()
    assert telemetry.step("admission", coroutine) is coroutine
    coroutine.close()
    telemetry.about(effect_id="eff_1")
    assert telemetry.fields() == {}


def test_a_log_format_or_tracing_from_the_environment_is_checked_as_typed_ones_are() -> None:
    for name, value, said in (
        ("FENCEPROXY_TRACING", "on", "FENCEPROXY_TRACING='on': --tracing is one of off, otlp"),
        (
            "FENCEPROXY_LOG_FORMAT",
            "xml",
            "FENCEPROXY_LOG_FORMAT='xml': --log-format is one of text, json",
        ),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "serve", "--config", "/nonexistent.yaml"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, name: value},
        )
        assert (done.returncode, done.stderr) == (1, f"fenceproxy: {said}\n")
