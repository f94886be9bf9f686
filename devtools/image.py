"""Build fenceproxy's OCI image without pulling from any registry.

The machines that build it reach Debian's package archive and PyPI only, so the image
is made from parts: a Debian root filesystem made by mmdebstrap (python3 and nothing
the proxy does not need), the proxy's wheel and its dependencies' wheels fetched on
the host (pip inside the chroot does not share the host's registry access) and
installed into /opt/fenceproxy with --no-index, a non-root user, and an example
policy. `podman import` turns the root filesystem into an image with its CMD,
EXPOSE, USER, VOLUME and ENV; `podman save` writes it as an OCI archive.

    python -m devtools.image [--wheel dist/fenceproxy-X.whl] [--out dist/image]

Writes OUT/rootfs.tar (what the tests start under chroot, since containers cannot run
on these machines), OUT/fenceproxy-oci.tar, and tags fenceproxy:VERSION in podman's
local store.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "bookworm"  # Python 3.11, as the wheels fetched on the host
PACKAGES = ["python3", "python3-venv", "ca-certificates"]
USER_ID = 10001
STATE_DIR = "/var/lib/fenceproxy"
CONFIG = "/etc/fenceproxy/fenceproxy.yaml"
VENV = "/opt/fenceproxy"
PORT = 8080
IMAGE_CONFIG = [
    f'CMD ["{VENV}/bin/fenceproxy", "serve", "--config", "{CONFIG}"]',
    f"EXPOSE {PORT}",
    "USER fenceproxy",
    f"WORKDIR {STATE_DIR}",
    f"VOLUME {STATE_DIR}",
    f"ENV FENCEPROXY_STATE_DIR={STATE_DIR}",
    f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
]


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def image_policy() -> str:
    """config/example.yaml as the image ships it: listening on every address of the
    container, the SQLite store on the state volume. Mount your own at CONFIG."""
    text = (ROOT / "config" / "example.yaml").read_text(encoding="utf-8")
    for example, shipped in (
        ("listen: {host: 127.0.0.1, port: 8080}", f"listen: {{host: 0.0.0.0, port: {PORT}}}"),
        ("store: sqlite:///../state/fenceproxy.db", f"store: sqlite:///{STATE_DIR}/fenceproxy.db"),
    ):
        if text.count(example) != 1:
            raise SystemExit(f"config/example.yaml no longer has {example!r} exactly once")
        text = text.replace(example, shipped)
    return "# The image's example policy: mount your own here.\n" + text


def fetch_wheels(wheel: Path, into: Path) -> None:
    """The proxy's wheel and every dependency as wheels, for --no-index in the chroot."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    shutil.copy(wheel, into / wheel.name)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:"]
    subprocess.run([*pip, "--dest", str(into), str(wheel)], check=True)


def build_rootfs(wheels: Path, policy: Path, rootfs: Path) -> None:
    def chroot(command: str) -> str:
        # A clean environment: the host's PIP_* settings (find-links, certificates) name
        # paths the chroot does not have.
        clean = f"env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root sh -c {shlex.quote(command)}"
        return f'--customize-hook=chroot "$1" {clean}'

    hooks = [
        f"--customize-hook=copy-in {wheels} /tmp",
        chroot(f"python3 -m venv {VENV}"),
        chroot(
            f"{VENV}/bin/pip install --quiet --no-index --find-links /tmp/{wheels.name} fenceproxy"
        ),
        chroot(f"rm -rf /tmp/{wheels.name} {VENV}/lib/python3*/site-packages/pip*"),
        chroot(
            f"useradd --system --uid {USER_ID} --user-group --home-dir {STATE_DIR} "
            "--create-home --shell /usr/sbin/nologin fenceproxy"
        ),
        chroot("mkdir -p /etc/fenceproxy"),
        f"--customize-hook=upload {policy} {CONFIG}",
        chroot(f"chmod 0644 {CONFIG}"),
    ]
    subprocess.run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            *hooks,
            SUITE,
            str(rootfs),
        ],
        check=True,
    )


def import_image(rootfs: Path, tag: str, archive: Path) -> None:
    changes = [part for line in IMAGE_CONFIG for part in ("--change", line)]
    subprocess.run(["podman", "import", "--quiet", *changes, str(rootfs), tag], check=True)
    archive.unlink(missing_ok=True)
    subprocess.run(
        ["podman", "save", "--quiet", "--format", "oci-archive", "-o", str(archive), tag],
        check=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.image", description=__doc__)
    parser.add_argument("--wheel", type=Path, help="the proxy's wheel (default: newest in dist/)")
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "image")
    args = parser.parse_args(argv)
    wheel = args.wheel or max((ROOT / "dist").glob("fenceproxy-*.whl"), default=None)
    if wheel is None or not zipfile.is_zipfile(wheel):
        print("no wheel in dist/: make wheel first (make image does)", file=sys.stderr)
        return 1
    for tool in ("mmdebstrap", "podman"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install {tool}", file=sys.stderr)
            return 1
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    policy = out / "fenceproxy.yaml"
    policy.write_text(image_policy(), encoding="utf-8")
    fetch_wheels(wheel, out / "wheels")
    rootfs = out / "rootfs.tar"
    build_rootfs(out / "wheels", policy, rootfs)
    tag = f"fenceproxy:{wheel_version(wheel)}"
    import_image(rootfs, tag, out / "fenceproxy-oci.tar")
    print(f"{tag}: {out / 'fenceproxy-oci.tar'} (root filesystem: {rootfs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
