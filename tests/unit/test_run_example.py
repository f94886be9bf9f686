"""What `make run` prints (demo/run_example.py)."""

from __future__ import annotations

from demo.run_example import PROXY_URL, what_to_try


def test_make_run_prints_the_status_page_url() -> None:
    text = what_to_try("demo-admin-token")
    assert f"{PROXY_URL}/_fence/ui/" in text
    assert "demo-admin-token" in text
