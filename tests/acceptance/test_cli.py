"""The installed `fenceproxy` console script, run as a user would run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "example.yaml"
RESOURCE = "supplier:widget"


def _find_cli() -> str:
    bin_dir = str(Path(sys.executable).parent)
    found = shutil.which("fenceproxy", path=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))
    assert found is not None, "the fenceproxy console script is not installed"
    return found


FENCEPROXY = _find_cli()


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def one_line_error(self) -> str:
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("fenceproxy: "), lines[0]
        return lines[0]


@dataclass(frozen=True)
class Cli:
    cwd: Path

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Result:
        environment = {k: v for k, v in os.environ.items() if k != "FENCEPROXY_CONFIG"}
        environment.update(env or {})
        done = subprocess.run(
            [FENCEPROXY, *args],
            cwd=self.cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


STORE_LINE = "store: sqlite:///../state/fenceproxy.db"


def example_on(store_url: str, path: Path) -> Path:
    """The example policy, on `store_url`, written to `path`."""
    text = EXAMPLE.read_text(encoding="utf-8")
    assert text.count(STORE_LINE) == 1
    path.write_text(text.replace(STORE_LINE, f"store: {store_url}"), encoding="utf-8")
    return path


@pytest.fixture
def config(cli: Cli, tmp_path: Path) -> Path:
    """The example policy on a fresh SQLite store under tmp_path (`store migrate`
    created it: no command but `serve` and `store migrate` creates a store)."""
    path = example_on(f"sqlite:///{tmp_path / 's.db'}", tmp_path / "fenceproxy.yaml")
    assert cli("store", "migrate", "--config", str(path)).code == 0
    return path


def test_a_command_on_a_missing_sqlite_store_refuses_and_creates_nothing(
    cli: Cli, tmp_path: Path
) -> None:
    """An empty store made on the spot would answer "nothing blocked", "epoch 0": not
    true of the proxy's store, wherever that is."""
    path = example_on(f"sqlite:///{tmp_path / 'elsewhere.db'}", tmp_path / "p.yaml")
    for command in (("reconcile", "list"), ("leases", "show", "rule:r1"), ("effects", "list")):
        error = cli(*command, "--config", str(path)).one_line_error()
        assert error == (
            f"fenceproxy: {path}: no store at {tmp_path / 'elsewhere.db'} (its store path is"
            " read from the policy file's folder); `fenceproxy serve` or `fenceproxy store"
            " migrate` creates it"
        )
    assert not (tmp_path / "elsewhere.db").exists()


def test_a_relative_sqlite_path_is_the_same_store_from_any_working_directory(
    tmp_path: Path,
) -> None:
    policy_folder = tmp_path / "etc"
    policy_folder.mkdir()
    path = example_on("sqlite:///state/fence.db", policy_folder / "policy.yaml")
    assert Cli(policy_folder)("store", "migrate", "--config", str(path)).code == 0
    assert (policy_folder / "state" / "fence.db").exists()
    assert (
        Cli(policy_folder)(
            "leases", "revoke", "rule:r1", "--reason", "t", "--config", str(path)
        ).code
        == 0
    )
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    shown = Cli(elsewhere)("leases", "show", "rule:r1", "--json", "--config", str(path))
    assert shown.code == 0, shown.err
    assert shown.json()["epoch"] == 1
    assert not (elsewhere / "state").exists()


# --- check-config -----------------------------------------------------------------------


def test_check_config_accepts_the_example(cli: Cli) -> None:
    result = cli("check-config", str(EXAMPLE))
    assert result.code == 0, result.err
    assert f"{EXAMPLE}: ok (4 routes, 2 fenced" in result.out


def test_check_config_reads_the_config_option_and_the_environment(cli: Cli) -> None:
    assert cli("check-config", "--config", str(EXAMPLE)).code == 0
    assert cli("check-config", env={"FENCEPROXY_CONFIG": str(EXAMPLE)}).code == 0


BAD = """\
version: 2
listen: {host: 127.0.0.1, port: "8080"}
upstreams:
  supplier: {url: "http://127.0.0.1:9001", timeout_s: 5, connect_timeout_s: 9}
routes:
  - name: place-order
    upstream: warehouse
    match: {methods: [POST], path: "/orders/{sku}"}
    resource: "supplier:{item}"
"""


def test_check_config_lists_every_problem_with_file_line_and_key(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD, encoding="utf-8")
    result = cli("check-config", str(bad))
    assert result.code != 0
    assert result.out == ""
    expected = [
        f"{bad}:1: version: only version 1 is known, got 2",
        f"{bad}:2: listen.port: expected an integer, got '8080'",
        f"{bad}:4: upstreams.supplier: connect_timeout_s (9) exceeds timeout_s (5)",
        f"{bad}:7: routes[0].upstream: upstream 'warehouse' is not defined",
        f"{bad}:9: routes[0].resource: {{item}} is not a parameter of path '/orders/{{sku}}'",
    ]
    for line in expected:
        assert line in result.err, result.err
    positions = [result.err.index(line) for line in expected]
    assert positions == sorted(positions)


def test_check_config_on_invalid_yaml_names_the_line(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("version: 1\nlisten: {port: 8080\nroutes: []\n", encoding="utf-8")
    result = cli("check-config", str(bad))
    assert result.code != 0
    assert f"{bad}:3: <file>: not valid YAML" in result.err


def test_check_config_on_a_missing_file_is_one_line(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = cli("check-config", str(missing))
    assert result.code != 0
    assert result.one_line_error() == f"fenceproxy: {missing}: no such file"
    assert result.out == ""


def test_command_without_a_policy_file_is_one_line(cli: Cli) -> None:
    result = cli("leases", "show", RESOURCE)
    assert result.code != 0
    assert "no policy file" in result.one_line_error()


# --- leases -----------------------------------------------------------------------------


def test_leases_show_on_a_fresh_store_is_epoch_0(cli: Cli, config: Path) -> None:
    result = cli("leases", "show", RESOURCE, "--config", str(config), "--json")
    assert result.code == 0, result.err
    assert result.json() == {
        "resource": RESOURCE,
        "epoch": 0,
        "next_epoch": 1,
        "holder": None,
        "client": None,
        "expires_at": None,
        "live": False,
        "blocked": False,
        "in_doubt": [],
    }


def test_leases_show_prints_a_table_for_people(cli: Cli, config: Path) -> None:
    result = cli("leases", "show", RESOURCE, "--config", str(config))
    assert result.code == 0, result.err
    header, row = result.out.splitlines()
    assert header.split() == [
        "epoch",
        "next_epoch",
        "holder",
        "client",
        "live",
        "blocked",
        "expires_at",
        "in_doubt",
    ]
    assert row.split()[:2] == ["0", "1"]
    # No holder, no client: "-" as in every other empty column, never Python's None.
    assert row.split()[2:4] == ["-", "-"]
    assert "None" not in result.out


def test_revoke_advances_the_epoch_and_it_persists_across_processes(cli: Cli, config: Path) -> None:
    first = cli("leases", "revoke", RESOURCE, "--reason", "x", "--config", str(config), "--json")
    assert first.code == 0, first.err
    assert first.json() == {"resource": RESOURCE, "revoked_epoch": 0, "epoch": 1}

    second = cli("leases", "revoke", RESOURCE, "--reason", "x", "--config", str(config), "--json")
    assert second.code == 0, second.err
    assert second.json() == {"resource": RESOURCE, "revoked_epoch": 1, "epoch": 2}

    shown = cli("leases", "show", RESOURCE, "--config", str(config), "--json")
    assert shown.code == 0, shown.err
    assert shown.json()["epoch"] == 2
    assert shown.json()["live"] is False

    other = cli("leases", "show", "supplier:other", "--config", str(config), "--json")
    assert other.json()["epoch"] == 0


def test_revoke_with_a_blank_reason_is_refused(cli: Cli, config: Path) -> None:
    result = cli("leases", "revoke", RESOURCE, "--reason", "  ", "--config", str(config))
    assert result.code != 0
    # The admin API's refusal, word for word: detail and code (proxy/operations.py).
    assert result.one_line_error() == "fenceproxy: reason must not be empty (invalid_request)"
    shown = cli("leases", "show", RESOURCE, "--config", str(config), "--json")
    assert shown.json()["epoch"] == 0


def test_invalid_resource_name_is_one_line(cli: Cli, config: Path) -> None:
    result = cli("leases", "show", "not valid", "--config", str(config))
    assert result.code != 0
    assert "'not valid' is not a valid resource name" in result.one_line_error()


# --- effects ----------------------------------------------------------------------------


def test_effects_list_on_a_fresh_store_is_empty(cli: Cli, config: Path) -> None:
    result = cli("effects", "list", "--config", str(config), "--json")
    assert result.code == 0, result.err
    assert result.json() == []


def test_effects_show_of_an_unknown_id_is_one_line(cli: Cli, config: Path) -> None:
    result = cli("effects", "show", "nope", "--config", str(config))
    assert result.code != 0
    assert result.one_line_error() == "fenceproxy: no effect nope (not_found)"
    assert result.out == ""


@pytest.mark.parametrize(
    ("args", "detail"),
    [
        (("effects", "list", "--limit", "0"), "limit must be a whole number 1-1000"),
        (("effects", "rejections", "--limit", "ten"), "limit must be a whole number 1-1000"),
        (("effects", "list", "--state", "committed"), "state must be one of DISPATCHING"),
    ],
)
def test_bad_listing_options_are_one_line(
    cli: Cli, config: Path, args: tuple[str, ...], detail: str
) -> None:
    # Checked by the operation, not argparse: the same refusal the admin API gives.
    result = cli(*args, "--config", str(config))
    assert result.code == 1
    line = result.one_line_error()
    assert line.startswith(f"fenceproxy: {detail}"), line
    assert line.endswith(" (invalid_request)"), line


def test_rejections_on_a_fresh_store_are_empty(cli: Cli, config: Path) -> None:
    result = cli("effects", "rejections", "--config", str(config), "--json")
    assert result.code == 0, result.err
    assert result.json() == []


# --- reconcile --------------------------------------------------------------------------


def test_reconcile_list_on_a_fresh_store_has_nothing_in_doubt(cli: Cli, config: Path) -> None:
    result = cli("reconcile", "list", "--config", str(config), "--json")
    assert result.code == 0, result.err
    assert result.json() == {"blocked_resources": [], "in_doubt": []}


def test_reconcile_probe_of_an_unknown_effect_is_one_line(cli: Cli, config: Path) -> None:
    result = cli("reconcile", "probe", "nope", "--config", str(config))
    assert result.code != 0
    assert result.one_line_error() == "fenceproxy: no effect nope (not_found)"


def test_reconcile_resolve_of_an_unknown_effect_is_one_line(cli: Cli, config: Path) -> None:
    result = cli(
        "reconcile",
        "resolve",
        "nope",
        "--outcome",
        "committed",
        "--reason",
        "checked the supplier portal",
        "--config",
        str(config),
    )
    assert result.code != 0
    assert "no effect nope" in result.one_line_error()


# --- lease-advice -----------------------------------------------------------------------


def test_lease_advice_prints_a_group_per_fenced_route_and_a_row_per_route(
    cli: Cli, config: Path
) -> None:
    result = cli("lease-advice", "--config", str(config))
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "supplier:*: 0 measured turn(s)" in lines
    assert "rule:*: 0 measured turn(s)" in lines
    header = next(line for line in lines if line.startswith("route "))
    rows = lines[lines.index(header) + 1 :]
    assert [row.split()[0] for row in rows] == ["place-order", "put-rule"]
    assert all(row.split()[-1] == "ok" for row in rows)


def test_lease_advice_json_without_turns_suggests_twice_the_upstream_timeout(
    cli: Cli, config: Path
) -> None:
    result = cli("lease-advice", "--config", str(config), "--json")
    assert result.code == 0, result.err
    advice = result.json()
    assert [group["resource"] for group in advice["groups"]] == ["supplier:*", "rule:*"]
    for group in advice["groups"]:
        # Nothing measured yet: no turn statistics, and the routes' timeout decides.
        assert group["turns"] == 0
        assert group["turn_s"] is None
        assert group["shortest_lease_s"] is None
        assert group["suggested_ttl_s"] == 10
    assert [route["route"] for route in advice["routes"]] == ["place-order", "put-rule"]
    assert all(route["timeout_s"] == 5 for route in advice["routes"])
    assert advice["problems"] == []


def test_lease_advice_fails_when_max_ttl_is_below_an_upstream_timeout(
    cli: Cli, config: Path
) -> None:
    text = config.read_text(encoding="utf-8")
    old = "leases: {min_ttl_s: 1, max_ttl_s: 300, default_ttl_s: 30}"
    assert text.count(old) == 1
    config.write_text(
        text.replace(old, "leases: {min_ttl_s: 1, max_ttl_s: 3, default_ttl_s: 2}"),
        encoding="utf-8",
    )
    table = cli("lease-advice", "--config", str(config))
    assert table.code != 0
    problems = [line for line in table.out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 2
    assert all("every write is refused" in line for line in problems)

    as_json = cli("lease-advice", "--config", str(config), "--json")
    assert as_json.code != 0
    assert len(as_json.json()["problems"]) == 2


def test_lease_advice_refuses_a_bad_option_in_one_line(cli: Cli, config: Path) -> None:
    result = cli("lease-advice", "--config", str(config), "--margin", "zero")
    assert result.code != 0
    assert "margin" in result.one_line_error()


# --- the lease API's exposure and clients' keys (check-config, serve) --------------------

AUTH_BLOCK = """
auth:
  clients:
    - name: routing-workers
      key_env: FENCEPROXY_TEST_KEY_ROUTING
      resources: ["rule:*"]
      may: [lease]
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _exposed(config: Path) -> str:
    text = config.read_text(encoding="utf-8")
    assert text.count("host: 127.0.0.1, port: 8080") == 1
    return text.replace("host: 127.0.0.1, port: 8080", "host: 0.0.0.0, port: 8080")


def test_check_config_warns_when_an_open_lease_api_listens_beyond_loopback(
    cli: Cli, config: Path, tmp_path: Path
) -> None:
    exposed = _write(tmp_path / "exposed.yaml", _exposed(config))
    result = cli("check-config", str(exposed))
    assert result.code == 0, result.err
    line = result.one_line_error()
    assert "warning" in line and "no auth: block" in line and "0.0.0.0:8080" in line
    assert cli("check-config", str(config)).err == ""


def test_check_config_does_not_warn_when_clients_are_configured(
    cli: Cli, config: Path, tmp_path: Path
) -> None:
    guarded = _write(tmp_path / "guarded.yaml", _exposed(config) + AUTH_BLOCK)
    result = cli("check-config", str(guarded), env={"FENCEPROXY_TEST_KEY_ROUTING": "k" * 32})
    assert (result.code, result.err) == (0, "")


@pytest.mark.parametrize("unset", ["", " \n"])
def test_check_config_warns_about_an_unset_key_and_serve_refuses_to_start(
    cli: Cli, config: Path, tmp_path: Path, unset: str
) -> None:
    """Empty or whitespace only: no key (a presented key is stripped, so a blank one
    would be no key either)."""
    guarded = _write(tmp_path / "guarded.yaml", config.read_text(encoding="utf-8") + AUTH_BLOCK)
    checked = cli("check-config", str(guarded), env={"FENCEPROXY_TEST_KEY_ROUTING": unset})
    assert checked.code == 0, checked.err
    assert "auth.clients[0].key_env (line " in checked.one_line_error()
    served = cli(
        "serve",
        "--config",
        str(guarded),
        "--state-dir",
        str(tmp_path / "state"),
        env={"FENCEPROXY_TEST_KEY_ROUTING": unset},
    )
    assert served.code == 1
    line = served.one_line_error()
    assert "auth.clients[0].key_env (line " in line
    assert "FENCEPROXY_TEST_KEY_ROUTING is not set" in line
    assert "routing-workers" in line
