"""Lease tokens: unguessable, well-formed, and stored only as a hash."""

from __future__ import annotations

import base64
import re

import pytest

from proxy.tokens import PREFIX, new_token, token_hash, well_formed


def test_token_carries_at_least_128_random_bits() -> None:
    token = new_token()
    assert token.startswith(PREFIX)
    body = token[len(PREFIX) :]
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    assert len(raw) * 8 >= 128
    assert len(raw) == 32


def test_token_uses_only_url_and_header_safe_characters() -> None:
    assert re.fullmatch(r"fpt_[A-Za-z0-9_-]+", new_token())


def test_new_tokens_are_all_different() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000


def test_new_tokens_are_well_formed() -> None:
    assert all(well_formed(new_token()) for _ in range(200))


@pytest.mark.parametrize(
    "junk",
    [
        "",
        "fpt_",
        "fpt_short",
        "xyz_" + "A" * 43,
        "FPT_" + "A" * 43,
        "fpt_" + "A" * 42,
        "fpt_" + "A" * 44,
        "fpt_" + "A" * 42 + ".",
        "fpt_" + "A" * 42 + "=",
        "fpt_" + "A" * 42 + " ",
        "fpt_" + "A" * 43 + "\n",
        " fpt_" + "A" * 43,
        "Bearer fpt_" + "A" * 43,
    ],
)
def test_well_formed_rejects_junk(junk: str) -> None:
    assert not well_formed(junk)


def test_token_hash_is_deterministic() -> None:
    token = new_token()
    assert token_hash(token) == token_hash(token)


def test_token_hash_is_sha256_hex_and_not_the_token() -> None:
    token = new_token()
    digest = token_hash(token)
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert digest != token
    assert token[len(PREFIX) :] not in digest


def test_token_hash_differs_between_tokens() -> None:
    assert token_hash(new_token()) != token_hash(new_token())
    assert token_hash("fpt_" + "A" * 43) != token_hash("fpt_" + "A" * 42 + "B")
