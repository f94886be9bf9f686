"""The one common name of a verified peer certificate, as Python's ssl reports it."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.tls import single_common_name


def subject(*relative_names: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    return {"subject": relative_names}


@pytest.mark.parametrize(
    ("certificate", "named"),
    [
        (subject((("commonName", "worker-7"),)), "worker-7"),
        (subject((("organizationName", "acme"),), (("commonName", "worker-7"),)), "worker-7"),
        (subject((("organizationName", "acme"),)), None),
        (subject(), None),
        # Two CNs, in two relative names or in one multi-valued one: no identity.
        (subject((("commonName", "worker-7"),), (("commonName", "admin"),)), None),
        (subject((("commonName", "worker-7"), ("commonName", "admin"))), None),
        (subject((("commonName", "worker-7"),), (("commonName", "worker-7"),)), None),
    ],
)
def test_a_subject_names_one_common_name_or_none(
    certificate: dict[str, Any], named: str | None
) -> None:
    assert single_common_name(certificate) == named
