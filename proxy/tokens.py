"""Lease tokens: 256 random bits, shown once, stored only as a SHA-256 hash.

A token is an unguessable bearer secret, so a fast hash is enough: there is
nothing to brute-force that is cheaper than guessing 256 bits.
"""

from __future__ import annotations

import hashlib
import re
import secrets

PREFIX = "fpt_"
TOKEN_RE = re.compile(r"fpt_[A-Za-z0-9_-]{43}\Z")


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def well_formed(token: str) -> bool:
    return TOKEN_RE.match(token) is not None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
