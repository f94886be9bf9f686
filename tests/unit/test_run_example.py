"""What `make run` prints (demo/run_example.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from demo.run_example import EXAMPLE_CONFIG, what_to_try, write_config
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


def test_the_example_policy_names_the_store_make_run_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `make run` leaves state/fenceproxy.db in the project's folder; read from
    # config/, the example's relative store path must name that file, or the loader's
    # guard against a store moved by the relative-path rule refuses the example (and
    # every test that loads it) once the demo has run.
    (tmp_path / "config").mkdir()
    shutil.copy(EXAMPLE_CONFIG, tmp_path / "config" / "example.yaml")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "fenceproxy.db").touch()
    monkeypatch.chdir(tmp_path)
    policy = load_policy(Path("config") / "example.yaml")
    stored = Path(policy.store.removeprefix("sqlite:///"))
    assert stored.resolve() == (tmp_path / "state" / "fenceproxy.db").resolve()
