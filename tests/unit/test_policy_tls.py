"""TLS settings in the policy: `listen.tls` and an upstream's `ca_bundle`, proven to load
at start, each problem on its own line and key; and the contexts built from them."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from policies import ConfigError, ListenTLS, Problem, load_policy
from policies.tls import server_context, upstream_context
from proxy.cli import main
from tests.certificates import Issued, TestCA

# Line numbers matter: the tests assert the line and key path of each problem.
POLICY = """\
version: 1
listen:
  host: 127.0.0.1
  port: 8443
{tls}
store: sqlite:///state/test.db
upstreams:
  supplier:
    url: "{url}"
{upstream}
routes:
  - name: place-order
    upstream: supplier
    match: {{methods: [POST], path: "/orders/{{sku}}"}}
    resource: "supplier:{{sku}}"
"""
TLS_LINE = 6  # the first key under listen.tls
UPSTREAM_LINE = 12  # the first line of {upstream}, after two keys under listen.tls


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestCA, Issued, Issued]:
    """A CA in conf/tls/, its server certificate and a client certificate."""
    ca = TestCA(tmp_path_factory.mktemp("conf") / "tls", "test")
    return ca, ca.server("server"), ca.client("worker-7")


def write_policy(
    folder: Path,
    tls: tuple[str, ...] = ("cert: tls/server.pem", "key: tls/server-key.pem"),
    url: str = "http://127.0.0.1:9001",
    upstream: tuple[str, ...] = ("timeout_s: 5",),
) -> Path:
    path = folder / "fenceproxy.yaml"
    path.write_text(
        POLICY.format(
            tls="\n".join(["  tls:", *(f"    {line}" for line in tls)]) if tls else "",
            url=url,
            upstream="\n".join(f"    {line}" for line in upstream),
        )
    )
    return path


def problems_loading(path: Path) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    return info.value.problems


def assert_single_problem(path: Path, line: int, key: str, message_part: str) -> None:
    problems = problems_loading(path)
    assert [(p.line, p.key) for p in problems] == [(line, key)], problems
    assert message_part in problems[0].message, problems[0].message


def folder_of(certificates: tuple[TestCA, Issued, Issued]) -> Path:
    return certificates[0].folder.parent


# --- the listener ------------------------------------------------------------------------


def test_tls_paths_are_relative_to_the_policy_files_folder(
    certificates: tuple[TestCA, Issued, Issued],
) -> None:
    ca, server, _ = certificates
    policy = load_policy(
        write_policy(
            folder_of(certificates),
            ("cert: tls/server.pem", "key: tls/server-key.pem", "client_ca: tls/test-ca.pem"),
        )
    )
    assert policy.listen.tls == ListenTLS(str(server.cert), str(server.key), str(ca.cert))


def test_without_tls_the_listener_is_plain_http(
    certificates: tuple[TestCA, Issued, Issued],
) -> None:
    assert load_policy(write_policy(folder_of(certificates), tls=())).listen.tls is None


@pytest.mark.parametrize(
    ("tls", "line", "key", "message"),
    [
        (("cert: tls/absent.pem", "key: tls/server-key.pem"), 0, "cert", "cannot be read"),
        (("cert: tls/server-key.pem", "key: tls/server-key.pem"), 0, "cert", "no PEM certificate"),
        (("cert: tls/server.pem", "key: tls/absent.pem"), 1, "key", "cannot be read"),
        (("cert: tls/server.pem", "key: tls/server.pem"), 1, "key", "not the PEM private key"),
        (("cert: tls/server.pem", "key: tls/worker-7-key.pem"), 1, "key", "not the PEM private"),
        (
            ("cert: tls/server.pem", "key: tls/server-key.pem", "client_ca: tls/server-key.pem"),
            2,
            "client_ca",
            "no PEM certificate",
        ),
        (
            ("cert: tls/server.pem", "key: tls/server-key.pem", "client_ca: tls"),
            2,
            "client_ca",
            "cannot be read",
        ),
        (("cert: tls/server.pem", "key: tls/server-key.pem", "ca: x"), 2, "ca", "unknown key"),
        (("cert: 42", "key: tls/server-key.pem"), 0, "cert", "expected a non-empty string"),
    ],
    ids=[
        "cert-missing",
        "cert-not-a-certificate",
        "key-missing",
        "key-not-a-key",
        "key-of-another-certificate",
        "client-ca-not-a-certificate",
        "client-ca-a-folder",
        "unknown-key",
        "cert-not-text",
    ],
)
def test_a_listener_file_that_does_not_load_is_named_with_its_line(
    certificates: tuple[TestCA, Issued, Issued],
    tls: tuple[str, ...],
    line: int,
    key: str,
    message: str,
) -> None:
    path = write_policy(folder_of(certificates), tls)
    assert_single_problem(path, TLS_LINE + line, f"listen.tls.{key}", message)


def test_the_key_is_required(certificates: tuple[TestCA, Issued, Issued]) -> None:
    path = write_policy(folder_of(certificates), ("cert: tls/server.pem",))
    assert_single_problem(path, TLS_LINE, "listen.tls.key", "missing required key 'key'")


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(
    certificates: tuple[TestCA, Issued, Issued],
) -> None:
    _, server, _ = certificates
    key = serialization.load_pem_private_key(server.key.read_bytes(), password=None)
    encrypted = server.key.with_name("encrypted-key.pem")
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    path = write_policy(
        folder_of(certificates), ("cert: tls/server.pem", "key: tls/encrypted-key.pem")
    )
    assert_single_problem(path, TLS_LINE + 1, "listen.tls.key", "the key is encrypted")


def test_the_listener_context_needs_tls_1_2_and_a_client_certificate_from_the_client_ca(
    certificates: tuple[TestCA, Issued, Issued],
) -> None:
    ca, server, _ = certificates
    plain = server_context(ListenTLS(str(server.cert), str(server.key)))
    mutual = server_context(ListenTLS(str(server.cert), str(server.key), str(ca.cert)))
    assert plain.minimum_version is ssl.TLSVersion.TLSv1_2
    assert plain.verify_mode is ssl.CERT_NONE
    assert mutual.minimum_version is ssl.TLSVersion.TLSv1_2
    assert mutual.verify_mode is ssl.CERT_REQUIRED
    assert [c["subject"] for c in mutual.get_ca_certs()] == [((("commonName", "test"),),)]


# --- upstreams -----------------------------------------------------------------------------


def test_an_https_upstream_takes_a_ca_bundle_relative_to_the_policy_file(
    certificates: tuple[TestCA, Issued, Issued],
) -> None:
    ca, _, _ = certificates
    policy = load_policy(
        write_policy(
            folder_of(certificates),
            url="https://127.0.0.1:9443",
            upstream=("ca_bundle: tls/test-ca.pem",),
        )
    )
    upstream = policy.upstreams["supplier"]
    assert upstream.ca_bundle == str(ca.cert)
    context = upstream_context(upstream)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname is True
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    # Only the bundle's CAs, not the system's as well.
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "test"),),)]


def test_without_a_ca_bundle_an_https_upstream_is_verified_against_the_system_store(
    certificates: tuple[TestCA, Issued, Issued],
) -> None:
    policy = load_policy(write_policy(folder_of(certificates), url="https://127.0.0.1:9443"))
    upstream = policy.upstreams["supplier"]
    assert upstream.ca_bundle is None
    context = upstream_context(upstream)
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_REQUIRED, True)


@pytest.mark.parametrize(
    ("url", "bundle", "message"),
    [
        ("https://127.0.0.1:9443", "tls/absent.pem", "cannot be read"),
        ("https://127.0.0.1:9443", "tls/server-key.pem", "no PEM certificate"),
        ("http://127.0.0.1:9001", "tls/test-ca.pem", "only an https url is verified"),
    ],
    ids=["missing", "not-a-certificate", "plain-http-url"],
)
def test_a_ca_bundle_that_cannot_verify_is_named_with_its_line(
    certificates: tuple[TestCA, Issued, Issued], url: str, bundle: str, message: str
) -> None:
    path = write_policy(folder_of(certificates), url=url, upstream=(f"ca_bundle: {bundle}",))
    assert_single_problem(path, UPSTREAM_LINE, "upstreams.supplier.ca_bundle", message)


@pytest.mark.parametrize(
    ("tls", "summary"),
    [
        ((), "store sqlite:///{folder}/state/test.db, max 1280 connections)"),
        (
            ("cert: tls/server.pem", "key: tls/server-key.pem"),
            "store sqlite:///{folder}/state/test.db, TLS, max 1280 connections)",
        ),
        (
            ("cert: tls/server.pem", "key: tls/server-key.pem", "client_ca: tls/test-ca.pem"),
            "store sqlite:///{folder}/state/test.db, mutual TLS, max 1280 connections)",
        ),
    ],
    ids=["plain", "tls", "mutual"],
)
def test_check_config_says_how_the_listener_speaks(
    certificates: tuple[TestCA, Issued, Issued],
    capsys: pytest.CaptureFixture[str],
    tls: tuple[str, ...],
    summary: str,
) -> None:
    path = write_policy(folder_of(certificates), tls)

    with pytest.raises(SystemExit) as exit_status:
        main(["check-config", str(path)])

    assert exit_status.value.code == 0
    summary_line = capsys.readouterr().out.splitlines()[0]
    # The store's relative path is read from the policy file's folder, as TLS files are.
    expected = summary.format(folder=path.parent.absolute())
    assert summary_line == f"{path}: ok (1 route, 1 fenced, {expected}"
