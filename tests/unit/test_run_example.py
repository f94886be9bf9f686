"""What `make run` prints (demo/run_example.py)."""

from __future__ import annotations

from pathlib import Path

from demo.run_example import what_to_try


def test_make_run_prints_the_status_page_url_on_its_port() -> None:
    text = what_to_try("demo-admin-token", 8181, 9101, Path("state"))
    assert "http://127.0.0.1:8181/_fence/ui/" in text
    assert "demo-admin-token" in text
