"""What `make run` prints (demo/run_example.py)."""

from __future__ import annotations

from pathlib import Path

from demo.run_example import what_to_try, write_config
from policies import load_policy


def test_make_run_prints_the_status_page_url_on_its_port() -> None:
    text = what_to_try("demo-admin-token", 8181, 9101, Path("state"))
    assert "http://127.0.0.1:8181/_fence/ui/" in text
    assert "demo-admin-token" in text


def test_the_written_config_names_the_chosen_ports(tmp_path: Path) -> None:
    # The CLI reads state/fenceproxy.yaml: it must describe the proxy as it runs.
    written = write_config(8181, 9101, tmp_path)
    policy = load_policy(written)
    assert policy.listen.port == 8181
    assert {upstream.url for upstream in policy.upstreams.values()} == {"http://127.0.0.1:9101"}
