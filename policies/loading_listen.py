"""The listeners of a policy file: `listen` (with its TLS files) and `metrics_listen`;
and how a policy names a file (relative to its own folder, proven to load here)."""

from __future__ import annotations

from pathlib import Path

from policies.model import (
    Listen,
    ListenTLS,
)
from policies.nodes import Mapping, Problems
from policies.tls import certificates_problem, key_problem


def parse_listen(root: Mapping, problems: Problems, base: Path) -> Listen:
    node = root.child("listen")
    if node is None:
        return Listen("127.0.0.1", 8080)
    listen = Mapping(node, problems, {"host", "port", "tls"})
    host = listen.text("host", default="127.0.0.1")
    port = listen.number("port", default=8080, integer=True)
    if isinstance(port, int) and port > 65535:
        problems.add(listen.children["port"], f"not a TCP port: {port}")
    tls = _parse_listen_tls(listen, problems, base)
    return Listen(host or "127.0.0.1", port if isinstance(port, int) else 8080, tls)


def _parse_listen_tls(listen: Mapping, problems: Problems, base: Path) -> ListenTLS | None:
    """`listen.tls: {cert, key, client_ca}`: PEM files, each proven to load here."""
    node = listen.child("tls")
    if node is None:
        return None
    block = Mapping(node, problems, {"cert", "key", "client_ca"})
    if not block.valid:
        return None
    cert = certificates_file(block, "cert", base, required=True)
    key = _policy_file(block, "key", base, required=True)
    client_ca = certificates_file(block, "client_ca", base, required=False)
    if cert is None or key is None:
        return None
    tls = ListenTLS(cert, key, client_ca)
    problem = key_problem(tls)
    if problem is not None:
        problems.add(block.children["key"], problem)
    return tls


def _policy_file(block: Mapping, name: str, base: Path, required: bool) -> str | None:
    """A file path under `name`, relative to the policy file's folder."""
    raw = block.text(name) if required else block.text(name, default=None)
    return str((base / raw).absolute()) if raw is not None else None


def certificates_file(block: Mapping, name: str, base: Path, required: bool) -> str | None:
    path = _policy_file(block, name, base, required)
    problem = certificates_problem(path) if path is not None else None
    if problem is not None:
        block.problems.add(block.children[name], problem)
        return None
    return path


def parse_metrics_listen(root: Mapping, problems: Problems, main: Listen) -> Listen | None:
    """`metrics_listen: {host, port}`: metrics on a listener of their own."""
    node = root.child("metrics_listen")
    if node is None:
        return None
    block = Mapping(node, problems, {"host", "port"})
    if not block.valid:
        return None
    host = block.text("host", default="127.0.0.1")
    port = block.number("port", integer=True)
    if not isinstance(port, int):
        return None
    if port > 65535:
        problems.add(block.children["port"], f"not a TCP port: {port}")
    elif port != 0 and port == main.port and host == main.host:
        problems.add(block.children["port"], f"{host}:{port} is the main listener's address")
    return Listen(host or "127.0.0.1", port)
