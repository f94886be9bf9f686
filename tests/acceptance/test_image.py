"""The OCI image `make image` builds (devtools/image.py), tested without running a
container: these machines cannot (crun fails on cgroups and rlimits), so the image's
own root filesystem is unpacked and its `fenceproxy serve` started under chroot, as
the image's user, with the image's environment, against the demo upstream on the
host. The image's config (CMD, EXPOSE, USER, VOLUME, ENV) is read from podman.

The image takes minutes to build, so `make test` does not build it: `.ci/run` runs
`make image` first, and under CI=true a missing image fails these tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.upstream import demo_upstream_argv
from devtools.image import CONFIG, PORT, STATE_DIR, VENV
from support.processes import ManagedProcess, free_port
from tests.acceptance.installed import fenced_order_goes_through
from tests.needs import missing

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = ROOT / "dist" / "image"
ROOTFS_TAR = IMAGE_DIR / "rootfs.tar"
STARTUP_TIMEOUT_S = 30.0


def _version() -> str:
    wheels = sorted((ROOT / "dist").glob("fenceproxy-*.whl"))
    return wheels[-1].name.split("-")[1] if wheels else "0.1.0"


TAG = f"fenceproxy:{_version()}"


def _missing() -> str | None:
    if os.geteuid() != 0 or shutil.which("chroot") is None:
        return "chroot needs root"
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman; .ci/run does)"
    if not ROOTFS_TAR.exists():
        return f"no image: make image (it writes {ROOTFS_TAR.relative_to(ROOT)})"
    return None


@pytest.fixture(scope="module")
def image_config() -> dict[str, Any]:
    absent = _missing()
    if absent is not None:
        missing(absent)  # CI builds the image first (.ci/run)
    inspected = subprocess.run(
        ["podman", "image", "inspect", TAG], capture_output=True, text=True, check=True
    )
    (image,) = json.loads(inspected.stdout)
    config: dict[str, Any] = image["Config"]
    return config


@pytest.fixture(scope="module")
def rootfs(image_config: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rootfs")
    with tarfile.open(ROOTFS_TAR) as tar:
        tar.extractall(root, filter="fully_trusted")
    return root


def test_the_image_runs_serve_as_a_non_root_user_with_its_state_on_a_volume(
    image_config: dict[str, Any],
) -> None:
    assert image_config["Cmd"] == [f"{VENV}/bin/fenceproxy", "serve", "--config", CONFIG]
    assert f"{PORT}/tcp" in image_config["ExposedPorts"]
    assert image_config["User"] == "fenceproxy"
    assert STATE_DIR in image_config["Volumes"]
    assert f"FENCEPROXY_STATE_DIR={STATE_DIR}" in image_config["Env"]


def in_image(rootfs: Path, image_config: dict[str, Any], *argv: str) -> list[str]:
    """`argv` as the image runs it: chroot, the image's user and environment."""
    return [
        "chroot",
        f"--userspec={image_config['User']}:{image_config['User']}",
        str(rootfs),
        "env",
        "-i",
        *image_config["Env"],
        f"HOME={STATE_DIR}",
        *argv,
    ]


def test_the_shipped_policy_passes_check_config(rootfs: Path, image_config: dict[str, Any]) -> None:
    checked = subprocess.run(
        in_image(rootfs, image_config, *image_config["Cmd"][:1], "check-config", CONFIG),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{CONFIG}: ok" in checked.stdout


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    argv = demo_upstream_argv(port, tmp_path / "upstream.db", access_log=False)
    with ManagedProcess("upstream", argv, log_path=tmp_path / "upstream.log", cwd=ROOT) as up:
        up.wait_http_ok(f"http://127.0.0.1:{port}/_demo/healthz", STARTUP_TIMEOUT_S)
        yield port


def test_serve_from_the_image_answers_readyz_and_fences_a_write(
    rootfs: Path, image_config: dict[str, Any], upstream: int, tmp_path: Path
) -> None:
    port = free_port()
    shipped = (rootfs / CONFIG.lstrip("/")).read_text(encoding="utf-8")
    test_config = "/etc/fenceproxy/test.yaml"
    (rootfs / test_config.lstrip("/")).write_text(
        shipped.replace("host: 0.0.0.0, port: 8080", f"host: 127.0.0.1, port: {port}").replace(
            "http://127.0.0.1:9001", f"http://127.0.0.1:{upstream}"
        ),
        encoding="utf-8",
    )
    command = [*image_config["Cmd"][:-1], test_config]
    with ManagedProcess(
        "image serve", in_image(rootfs, image_config, *command), log_path=tmp_path / "serve.log"
    ) as proxy:
        base = f"http://127.0.0.1:{port}"
        proxy.wait_http_ok(f"{base}/_fence/readyz", STARTUP_TIMEOUT_S)
        fenced_order_goes_through(base, "image-1")
    # The store is on the image's volume, written by the image's user.
    store = rootfs / STATE_DIR.lstrip("/") / "fenceproxy.db"
    assert store.exists()
    owner = store.stat().st_uid
    assert owner == (rootfs / STATE_DIR.lstrip("/")).stat().st_uid != 0
