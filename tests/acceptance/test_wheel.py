"""The wheel is the proxy and nothing else, and it runs outside the checkout.

Built with `python -m build` (no isolation: the dev virtualenv has the build tools,
and nothing is downloaded at test time), installed with `--no-deps` into a fresh
virtualenv whose dependencies are the dev virtualenv's site-packages (a .pth line),
then run from a folder outside the checkout: `fenceproxy --version`, `check-config`
and `serve` on a config made from config/example.yaml, with the demo upstream in
its own process and one fenced write through it.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from demo.run_example import write_config
from demo.upstream import demo_upstream_argv
from support.processes import ManagedProcess, free_port
from tests.acceptance.installed import fenced_order_goes_through

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"core", "policies", "proxy", "reconcile", "store"}
STARTUP_TIMEOUT_S = 30.0


def run(argv: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # From a copy: setuptools leaves build/ and *.egg-info where it builds.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in SHIPPED:
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / package, source / package, ignore=ignore)
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)]
    run([*build, "."], source)
    (built,) = out.glob("fenceproxy-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the wheel; its bin directory."""
    venv = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(venv)], venv)
    python = venv / "bin" / "python"
    run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        venv,
    )
    fresh_site = run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], venv
    ).stdout.strip()
    # The dependencies (aiohttp, asyncpg, ...) from the dev virtualenv, already installed;
    # its own .pth files (the checkout's) are not read from a directory added this way.
    (Path(fresh_site) / "dependencies.pth").write_text(site.getsitepackages()[0] + "\n")
    return venv / "bin"


def test_the_wheel_holds_the_proxy_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == SHIPPED
    assert "store/sqlite.sql" in names
    assert any(name.startswith("store/migrations/postgresql/") for name in names)
    assert any(name.startswith("proxy/ui/templates/") for name in names)
    metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
    assert "Requires-Python: >=3.11" in zipfile.ZipFile(wheel).read(metadata).decode()


def test_the_installed_proxy_runs_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    version = run([str(installed / "fenceproxy"), "--version"], outside)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert version.stdout.strip() == f"fenceproxy {project['version']}"
    where = run([str(installed / "python"), "-c", "import proxy; print(proxy.__file__)"], outside)
    assert not where.stdout.strip().startswith(str(ROOT)), where.stdout
    absent = subprocess.run(
        [str(installed / "python"), "-c", "import demo"], cwd=outside, capture_output=True
    )
    assert absent.returncode != 0, "demo/ must not be installed"

    port, upstream_port = free_port(), free_port()
    (outside / "state").mkdir()
    config = write_config(port, upstream_port, outside / "state")
    run([str(installed / "fenceproxy"), "check-config", str(config)], outside)
    upstream_argv = demo_upstream_argv(upstream_port, outside / "upstream.db", access_log=False)
    with (
        ManagedProcess(
            "upstream", upstream_argv, log_path=tmp_path / "upstream.log", cwd=ROOT
        ) as up,
        ManagedProcess(
            "serve",
            [str(installed / "fenceproxy"), "serve", "--config", str(config)],
            log_path=tmp_path / "serve.log",
            cwd=outside,
        ) as proxy,
    ):
        up.wait_http_ok(f"http://127.0.0.1:{upstream_port}/_demo/healthz", STARTUP_TIMEOUT_S)
        proxy.wait_http_ok(f"http://127.0.0.1:{port}/_fence/readyz", STARTUP_TIMEOUT_S)
        base = f"http://127.0.0.1:{port}"
        fenced_order_goes_through(base, "wheel-1")
