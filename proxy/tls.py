"""Who is at the other end of a mutual-TLS connection."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def client_subject(request: web.Request) -> str | None:
    """The common name (CN) in the subject of the client certificate the listener
    verified against `listen.tls.client_ca`, or None: no TLS, no client CA, or a
    certificate without exactly one CN. The handshake proved the caller holds that
    certificate's key; it is not a secret."""
    transport = request.transport
    if transport is None:
        return None
    # Python's ssl module reports a peer certificate's fields only once it was
    # verified, which a listener with a client CA requires.
    certificate = transport.get_extra_info("peercert")
    if not certificate:
        return None
    return single_common_name(certificate)


def single_common_name(certificate: dict[str, Any]) -> str | None:
    """The subject's CN when it has exactly one. With several, which is "the" name
    would be a guess (the first? the last?), and a CA that signed `CN=worker, CN=admin`
    for a worker must not make it admin: such a certificate names no one."""
    names = [
        str(value)
        for relative_name in certificate.get("subject", ())
        for field, value in relative_name
        if field == "commonName"
    ]
    return names[0] if len(names) == 1 else None
