"""Who is at the other end of a mutual-TLS connection."""

from __future__ import annotations

from aiohttp import web


def client_subject(request: web.Request) -> str | None:
    """The common name (CN) in the subject of the client certificate the listener
    verified against `listen.tls.client_ca`, or None: no TLS, no client CA, or a
    certificate without a CN. The handshake proved the caller holds that
    certificate's key; it is not a secret."""
    transport = request.transport
    if transport is None:
        return None
    # Python's ssl module reports a peer certificate's fields only once it was
    # verified, which a listener with a client CA requires.
    certificate = transport.get_extra_info("peercert")
    if not certificate:
        return None
    for relative_name in certificate.get("subject", ()):
        for field, value in relative_name:
            if field == "commonName":
                return str(value)
    return None
