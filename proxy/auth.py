"""Who is calling the control API, and what it may do there.

`authenticate(request)` is the one place a credential becomes a client: a bearer
key (a client's of the policy's `auth:` block, or an admin token), or a verified
TLS client certificate's subject. Once a call has let a client through
(`require`, `guard`), the client is on the request under `CLIENT`, for whatever is
keyed by it (quotas, logs).

The credentials in force are the `Keyring`'s; a policy reload makes new ones from
its `auth:` block and swaps them in with the policy (proxy/reloading.py). A request
takes them once (`credentials`) and keeps them to its end, as it keeps its policy.

Keys are never kept, only their SHA-256: a presented key is hashed and compared
with every configured digest in constant time, so neither a match nor its
position in the policy shows in the answer's timing.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from aiohttp import web

from core.codes import ErrorCode
from core.fencing import Clients
from core.records import Refusal
from policies import AuthClient, Listen, Policy, Right
from proxy.requests import CREDENTIAL_VERIFIED, single_header
from proxy.tls import client_subject

T = TypeVar("T")

# The admin token's client: every right on every resource. Its name is the actor
# recorded for what it does (policies refuse a client of that name).
ADMIN = AuthClient(
    name="admin", key_env=None, key_sha256=None, resources=("*",), may=frozenset({Right.ADMIN})
)
CLIENT = web.RequestKey("client", AuthClient)


class KeyProblem(Exception):
    """A client's key cannot be had (its variable is unset), or names two clients."""


def _digest(key: str) -> bytes:
    # A header's bytes that are not UTF-8 come from aiohttp as surrogates: hashed as
    # the bytes sent, they match no key (rather than failing to encode).
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def env_secret(environ: Mapping[str, str], name: str) -> str | None:
    """The key or token in variable `name`, without surrounding whitespace (a secret
    file's newline, a quoted value's spaces): a presented key is stripped too, so one
    kept with them could never match. None when unset, empty or whitespace only."""
    return environ.get(name, "").strip() or None


def blank_admin_token_warnings(policy: Policy, environ: Mapping[str, str]) -> list[str]:
    """One line per admin token variable that is set to whitespace only: taken as
    unset (the admin API off, or one token fewer), which is worth saying."""
    named = (
        ("admin_token_env", policy.admin_token_env),
        ("admin_token_next_env", policy.admin_token_next_env),
    )
    return [
        f"{key}: {name} holds only whitespace: taken as unset"
        for key, name in named
        if name is not None and environ.get(name) and env_secret(environ, name) is None
    ]


def missing_keys(policy: Policy, environ: Mapping[str, str]) -> list[str]:
    """One line per client whose `key_env` is unset, empty or whitespace only in
    `environ` (`env_secret`)."""
    if policy.auth is None:
        return []
    return [
        f"auth.clients[{index}].key_env (line {client.line}): {client.key_env} is not set "
        f"(or holds only whitespace), so client {client.name!r} has no key"
        for index, client in enumerate(policy.auth.clients)
        if client.key_env is not None and env_secret(environ, client.key_env) is None
    ]


@dataclass(frozen=True)
class Credentials:
    """The digests of every accepted key, each with its client."""

    keys: tuple[tuple[bytes, AuthClient], ...]
    # The policy has an `auth:` block: the lease API and every read need a key.
    required: bool
    # Clients named by a verified client certificate's subject CN instead of a key.
    subjects: Mapping[str, AuthClient] = field(default_factory=dict)

    @classmethod
    def of(
        cls, policy: Policy, admin_tokens: Sequence[str], environ: Mapping[str, str]
    ) -> Credentials:
        """From the policy, the admin tokens in use (stripped; blank ones ignored) and
        the environment the clients' `key_env` names are read from."""
        missing = missing_keys(policy, environ)
        if missing:
            raise KeyProblem(missing[0])
        keys = [(_digest(token.strip()), ADMIN) for token in admin_tokens if token.strip()]
        for client in policy.auth.clients if policy.auth is not None else ():
            if client.key_sha256 is not None:
                keys.append((bytes.fromhex(client.key_sha256), client))
            elif client.key_env is not None:
                key = env_secret(environ, client.key_env)
                assert key is not None  # missing_keys refused it above
                keys.append((_digest(key), client))
        seen: dict[bytes, AuthClient] = {}
        for digest, client in keys:
            other = seen.setdefault(digest, client)
            if other is not client:
                raise KeyProblem(
                    f"clients {other.name!r} and {client.name!r} have the same key: "
                    "a key must name one client"
                )
        subjects = {
            client.cert_subject: client
            for client in (policy.auth.clients if policy.auth is not None else ())
            if client.cert_subject is not None
        }
        return cls(tuple(keys), policy.auth is not None, subjects)

    def match(self, key: str) -> AuthClient | None:
        digest = _digest(key)
        found = None
        # Every digest is compared, a match or not: the time taken says nothing.
        for candidate, client in self.keys:
            if hmac.compare_digest(digest, candidate) and found is None:
                found = client
        return found

    def carried_by(self, authorization: str) -> bool:
        """Whether an Authorization value presents one of these keys, as a bearer
        credential or bare: then it is this proxy's credential, never the upstream's.
        Both readings are compared, in constant time, whatever the first one found."""
        value = authorization.strip()
        scheme, _, rest = value.partition(" ")
        readings = [value, rest.strip() if scheme.lower() == "bearer" else value]
        return any([self.match(reading) is not None for reading in readings])

    @property
    def admin_api_on(self) -> bool:
        return bool(self.keys)

    @functools.cached_property
    def standing(self) -> Clients:
        """The clients whose leases stand (core.fencing.check_standing): every client a
        key or certificate names now; None without `auth:`."""
        if not self.required:
            return None
        clients = {client.name: client for _, client in self.keys}
        clients.update((client.name, client) for client in self.subjects.values())
        return clients


@dataclass
class Keyring:
    """The credentials in force, and what they are made of besides the policy: the
    admin tokens and the environment the clients' `key_env` are read from, both
    taken once at start (a reload cannot change a running process's environment)."""

    current: Credentials
    admin_tokens: tuple[str, ...] = ()
    environ: Mapping[str, str] = field(default_factory=dict)

    def made_for(self, policy: Policy) -> Credentials:
        """The credentials of `policy`'s clients; `KeyProblem` as at start."""
        return Credentials.of(policy, self.admin_tokens, self.environ)


KEYRING = web.AppKey("keyring", Keyring)
_TAKEN = web.RequestKey("credentials", Credentials)


def take_credentials(request: web.Request) -> Credentials:
    """The credentials this request is judged by: those in force when it first asked,
    kept to its end. A reload under way changes neither who it is nor which
    Authorization header is the proxy's to keep from the upstream."""
    taken = request.get(_TAKEN)
    if taken is None:
        taken = request[_TAKEN] = request.config_dict[KEYRING].current
    return taken


def authenticate(request: web.Request) -> AuthClient | None:
    """The client whose key the request presents (`Authorization: Bearer KEY`); without
    that header, the client its connection's verified certificate names
    (`cert_subject`); or None. A key, when presented, is the only credential judged."""
    header = single_header(request, "Authorization")
    if header is None:
        subject = client_subject(request)
        if subject is None:
            return None
        return take_credentials(request).subjects.get(subject)
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return None
    return take_credentials(request).match(key)


def require(request: web.Request, right: Right, resource: str | None = None) -> AuthClient:
    """The caller, if it holds `right` (and covers `resource`): otherwise 401 for no
    valid key, 403 `forbidden` for a right it lacks, 403 `forbidden_resource`."""
    credentials = take_credentials(request)
    client = authenticate(request)
    if client is None:
        if not credentials.admin_api_on:
            raise Refusal(
                ErrorCode.UNAUTHORIZED, "the admin API is off: no admin token is configured"
            )
        wanted = "a client's key or the admin token" if credentials.required else "admin token"
        raise Refusal(ErrorCode.UNAUTHORIZED, f"this call needs Authorization: Bearer <{wanted}>")
    if not client.holds(right):
        raise Refusal(
            ErrorCode.FORBIDDEN,
            f"client {client.name!r} may not {right.value} (auth.clients[].may)",
            {"client": client.name},
        )
    request[CLIENT] = client
    # Its connection is kept while its body comes (proxy/connections.py).
    request[CREDENTIAL_VERIFIED] = True
    if resource is not None:
        check_scope(client, resource)
    return client


def guard(request: web.Request, right: Right, resource: str | None = None) -> AuthClient | None:
    """For the calls open to anyone without `auth:` (acquire, lease view, metrics):
    None then; with it, `require`."""
    if not take_credentials(request).required:
        return None
    return require(request, right, resource)


def check_scope(client: AuthClient | None, resource: str | None) -> None:
    if client is not None and not client.covers(resource):
        raise Refusal(
            ErrorCode.FORBIDDEN_RESOURCE,
            f"client {client.name!r} may not act on {resource or 'rows of no resource'}: "
            "it matches none of its resources globs",
            {"client": client.name, "resource": resource},
        )


def in_scope(
    client: AuthClient, rows: Iterable[T], resource_of: Callable[[T], str | None]
) -> list[T]:
    """The rows about resources the client covers: what a listing shows it."""
    return [row for row in rows if client.covers(resource_of(row))]


LOOPBACK_NAMES = frozenset({"localhost"})


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(policy: Policy) -> str | None:
    """One line when the lease API is open (no `auth:`) on a non-loopback listener."""
    if policy.auth is not None:
        return None
    exposed = [
        f"{listen.host}:{listen.port}"
        for listen in (policy.listen, policy.metrics_listen)
        if isinstance(listen, Listen) and not is_loopback(listen.host)
    ]
    if not exposed:
        return None
    return (
        f"no auth: block, yet listening on {', '.join(exposed)}: anyone who can "
        "reach it can take any free resource and read holder names"
    )
