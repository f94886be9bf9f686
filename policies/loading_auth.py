"""A policy file's `auth:` block (its clients, their credentials, resources and
rights), and the environment variable names a policy gives for secrets."""

from __future__ import annotations

import re

from policies.model import (
    HOLDER_RE,
    MAX_RESOURCE_CHARS,
    RESOURCE_CHARS,
    Auth,
    AuthClient,
    Listen,
    Right,
)
from policies.nodes import Mapping, Node, Problems

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}\Z")
# What a resource glob may hold: resource characters and fnmatch's own.
_GLOB = re.compile(rf"[*?\[\]!{RESOURCE_CHARS}]{{1,{MAX_RESOURCE_CHARS}}}\Z")
# The admin token's actor name: a client of that name could not be told apart from it.
RESERVED_CLIENT_NAMES = frozenset({"admin"})


def env_name(block: Mapping, key: str, problems: Problems) -> str | None:
    name = block.text(key, default=None)
    if name is not None and not _ENV_NAME.match(name):
        problems.add(block.children[key], f"expected an environment variable name, got {name!r}")
        return None
    return name if isinstance(name, str) else None


def parse_auth(root: Mapping, problems: Problems, listen: Listen) -> Auth | None:
    """`auth: {clients: [{name, key_env | key_sha256 | cert_subject, resources, may}]}`."""
    node = root.child("auth")
    if node is None:
        return None
    block = Mapping(node, problems, {"clients"})
    clients_node = block.child("clients", required=True)
    if clients_node is None:
        return None
    if not clients_node.is_sequence:
        problems.add(clients_node, f"expected a list of clients, got {clients_node.describe()}")
        return None
    clients: list[AuthClient] = []
    names: dict[str, int] = {}
    digests: dict[str, int] = {}
    subjects: dict[str, int] = {}
    for element in clients_node.elements():
        client = _parse_client(element, problems)
        if client is None:
            continue
        if client.cert_subject is not None:
            if listen.tls is None or listen.tls.client_ca is None:
                problems.add(
                    element,
                    "cert_subject needs listen.tls.client_ca: only a client certificate "
                    "verified against it can name a client",
                )
            elif client.cert_subject in subjects:
                problems.add(
                    element,
                    f"cert_subject is also the subject of the client on line "
                    f"{subjects[client.cert_subject]}: a certificate must name one client",
                )
            subjects.setdefault(client.cert_subject, element.line)
        if client.name in names:
            problems.add(
                element, f"client name {client.name!r} is already used on line {names[client.name]}"
            )
        names.setdefault(client.name, element.line)
        if client.key_sha256 is not None:
            if client.key_sha256 in digests:
                problems.add(
                    element,
                    f"key_sha256 is also the key of the client on line "
                    f"{digests[client.key_sha256]}: a key must name one client",
                )
            digests.setdefault(client.key_sha256, element.line)
        clients.append(client)
    if not clients and not problems:
        problems.add(clients_node, "at least one client is needed (or leave auth out)")
    return Auth(tuple(clients))


def _parse_client(node: Node, problems: Problems) -> AuthClient | None:
    spec = Mapping(
        node, problems, {"name", "key_env", "key_sha256", "cert_subject", "resources", "may"}
    )
    if not spec.valid:
        return None
    before = len(problems.items)
    name = _client_name(spec)
    key_env, key_sha256, cert_subject = _client_credential(spec, node)
    globs = _client_globs(spec)
    rights = _client_rights(spec)
    if len(problems.items) > before:
        return None
    assert name is not None
    return AuthClient(
        name=name,
        key_env=key_env,
        key_sha256=key_sha256.lower() if key_sha256 is not None else None,
        resources=globs,
        may=frozenset(rights),
        line=node.line,
        cert_subject=cert_subject,
    )


def _client_name(spec: Mapping) -> str | None:
    name: str | None = spec.text("name")
    if name is not None and not HOLDER_RE.match(name):
        spec.problems.add(
            spec.children["name"],
            f"{name!r} is not a valid client name (1-128 of A-Z a-z 0-9 . _ : @ -)",
        )
    elif name in RESERVED_CLIENT_NAMES:
        spec.problems.add(spec.children["name"], f"{name!r} is the admin token's name")
    return name


def _client_credential(spec: Mapping, node: Node) -> tuple[str | None, str | None, str | None]:
    """The client's one credential: (key_env, key_sha256, cert_subject), one of them set."""
    problems = spec.problems
    key_env = env_name(spec, "key_env", problems)
    key_sha256 = spec.text("key_sha256", default=None)
    if key_sha256 is not None and not _SHA256_HEX.match(key_sha256):
        problems.add(
            spec.children["key_sha256"],
            'expected the key\'s SHA-256 as 64 hex digits (printf %s "$KEY" | sha256sum)',
        )
    cert_subject = spec.text("cert_subject", default=None)
    if cert_subject is not None and not cert_subject.strip():
        problems.add(spec.children["cert_subject"], "expected a certificate subject's CN")
    credentials = ("key_env", "key_sha256", "cert_subject")
    if sum(key in spec.children for key in credentials) != 1:
        problems.add(node, "a client needs exactly one of key_env, key_sha256 and cert_subject")
    return key_env, key_sha256, cert_subject


def _client_globs(spec: Mapping) -> tuple[str, ...]:
    globs = spec.text_list("resources", required=True) or []
    for glob, element in globs:
        if not _GLOB.match(glob):
            spec.problems.add(
                element,
                f"{glob!r} is not a resource glob (resource characters and * ? [ ] !)",
            )
    if "resources" in spec.children and spec.children["resources"].is_sequence and not globs:
        spec.problems.add(spec.children["resources"], "at least one resource glob is needed")
    return tuple(glob for glob, _ in globs)


def _client_rights(spec: Mapping) -> set[Right]:
    rights: set[Right] = set()
    known = ", ".join(right.value for right in Right)
    for value, element in spec.text_list("may", required=True) or []:
        try:
            rights.add(Right(value))
        except ValueError:
            spec.problems.add(element, f"unknown right {value!r} (known: {known})")
    may = spec.children.get("may")
    if may is not None and may.is_sequence and not may.raw.value:
        spec.problems.add(may, f"at least one right is needed ({known})")
    return rights
