"""TLS contexts from the policy's files: the listener's, and each upstream's.

The loader builds them once to prove the files load (so `check-config` and `serve`
fail at start, naming the key, rather than at the first handshake); `serve`, the
forwarding pools and the prober build them again from the same paths.
"""

from __future__ import annotations

import functools
import re
import ssl
from pathlib import Path

from policies.model import ListenTLS, Upstream

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
_SOURCE_LOCATION = re.compile(r" \(_ssl\.c:\d+\)")


class EncryptedKeyError(ValueError):
    """The key file is encrypted; a server started unattended has no one to ask."""


def _refuse_passphrase() -> bytes:
    # Without a callback, OpenSSL would prompt on the terminal for the passphrase and
    # hang a service that has no terminal.
    raise EncryptedKeyError("the key is encrypted; give an unencrypted PEM key")


def server_context(tls: ListenTLS) -> ssl.SSLContext:
    """The listener's context: TLS 1.2 or later; with a client CA, a client certificate
    that chains to it is required before any request is read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    context.load_cert_chain(tls.cert, tls.key, password=_refuse_passphrase)
    if tls.client_ca is not None:
        context.load_verify_locations(cafile=tls.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@functools.cache
def upstream_context(upstream: Upstream) -> ssl.SSLContext:
    """How the proxy checks an https upstream: the certificate must chain to
    `ca_bundle` (only those CAs) or, without one, to the system's trust store, and must
    name the URL's host. Cached: one context per upstream keeps its pooled connections
    reusable (aiohttp keys a pooled connection by its context)."""
    context = ssl.create_default_context(cafile=upstream.ca_bundle)
    context.minimum_version = MINIMUM_VERSION
    return context


def certificates_problem(path: str) -> str | None:
    """Why `path` holds no PEM certificate that loads, or None if it does."""
    try:
        Path(path).read_bytes()
    except OSError as exc:
        return f"cannot be read: {_reason(exc)}"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except (ssl.SSLError, ValueError) as exc:
        return f"holds no PEM certificate that loads: {_reason(exc)}"
    return None


def key_problem(tls: ListenTLS) -> str | None:
    """Why the listener's key does not load with its certificate, or None if it does."""
    try:
        Path(tls.key).read_bytes()
    except OSError as exc:
        return f"cannot be read: {_reason(exc)}"
    try:
        server_context(ListenTLS(tls.cert, tls.key))
    except EncryptedKeyError as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"not the PEM private key of {tls.cert}: {_reason(exc)}"
    return None


def _reason(exc: Exception) -> str:
    return _SOURCE_LOCATION.sub("", str(exc))
