"""The deployment examples (examples/deploy, docs/how-to/deployment.md) say only what is true:
their policies load, their probes ask the proxy's health endpoints, every
FENCEPROXY_* variable they set is one the proxy reads, and the alert rules name
metrics the proxy exports and pass `promtool check rules`, and the systemd unit installed as
the guide installs it passes `systemd-analyze verify`."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import Policy, parse_policy
from proxy.identity import STATE_DIR_ENV
from proxy.metrics import Metrics
from tests.needs import missing

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy"
KUBERNETES = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
SYSTEMD = DEPLOY / "systemd" / "fenceproxy.service"
SYSTEMD_POLICY = DEPLOY / "systemd" / "fenceproxy.yaml"
GUIDE = ROOT / "docs" / "how-to" / "deployment.md"
# Read by the proxy outside the policy (proxy/app.py, proxy/identity.py).
PROCESS_VARIABLES = {"FENCEPROXY_INSTANCE_ID", STATE_DIR_ENV, "FENCEPROXY_LOG_LEVEL"}


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def policies_in(path: Path) -> dict[str, Policy]:
    """ConfigMap name → the fenceproxy.yaml it holds, loaded as `serve` loads it."""
    return {
        doc["metadata"]["name"]: parse_policy(doc["data"]["fenceproxy.yaml"], str(path))
        for doc in documents(path)
        if doc["kind"] == "ConfigMap"
    }


def proxy_containers(path: Path) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) of every fenceproxy container in the file."""
    for doc in documents(path):
        if doc["kind"] in ("Deployment", "StatefulSet"):
            spec = doc["spec"]["template"]["spec"]
            for container in spec["containers"]:
                if container["name"] == "fenceproxy":
                    yield spec, container


def probe_target(probe: dict[str, Any]) -> str:
    if "httpGet" in probe:
        return str(probe["httpGet"]["path"])
    return " ".join(probe["exec"]["command"])


def variables_read(policy: Policy) -> set[str]:
    read = set(PROCESS_VARIABLES)
    read |= {name for name in (policy.admin_token_env, policy.admin_token_next_env) if name}
    if policy.auth is not None:
        read |= {client.key_env for client in policy.auth.clients if client.key_env}
    return read


@pytest.mark.parametrize("path", KUBERNETES, ids=lambda path: path.name)
def test_kubernetes_examples_run_the_policy_they_mount(path: Path) -> None:
    policies = policies_in(path)
    containers = list(proxy_containers(path))
    assert policies and containers
    for spec, container in containers:
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        config_path = Path(container["args"][container["args"].index("--config") + 1])
        assert container["args"][0] == "serve"
        config_map = volumes[mounts[str(config_path.parent)]]["configMap"]["name"]
        policy = policies[config_map]
        assert policy.store.startswith("postgresql://"), "a shared authority, not a file each"
        assert "@" in policy.store and ":" not in policy.store.split("@")[0].removeprefix(
            "postgresql://"
        ), "no password in the store URL: PGPASSWORD from the Secret"
        assert "/_fence/readyz" in probe_target(container["readinessProbe"])
        assert "/_fence/healthz" in probe_target(container["livenessProbe"])
        names = {variable["name"] for variable in container["env"]}
        fenceproxy_names = {name for name in names if name.startswith("FENCEPROXY_")}
        assert fenceproxy_names <= variables_read(policy), fenceproxy_names
        assert {"FENCEPROXY_INSTANCE_ID", STATE_DIR_ENV} <= names
        assert policy.admin_token_env in names
        state_dir = next(v["value"] for v in container["env"] if v["name"] == STATE_DIR_ENV)
        assert state_dir in mounts, "the state directory is a writable volume"


def test_a_listener_beyond_loopback_has_auth() -> None:
    for path in KUBERNETES:
        for policy in policies_in(path).values():
            if policy.listen.host not in ("127.0.0.1", "::1", "localhost"):
                assert policy.auth is not None, path


def test_the_systemd_unit_serves_with_variables_the_proxy_reads() -> None:
    unit = SYSTEMD.read_text(encoding="utf-8")
    assert re.search(r"^ExecStart=\S*/fenceproxy serve --config \S+", unit, re.MULTILINE)
    set_here = set(re.findall(r"^Environment=(FENCEPROXY_[A-Z_]+)=", unit, re.MULTILINE))
    assert set_here <= PROCESS_VARIABLES, set_here
    state_dir = re.search(rf"^Environment={STATE_DIR_ENV}=(\S+)", unit, re.MULTILINE)
    assert state_dir is not None
    assert f"ReadWritePaths={state_dir.group(1)}" in unit


def systemd_install_steps() -> str:
    """The guide's plain-host install, the shell block after its marker comment."""
    guide = GUIDE.read_text(encoding="utf-8")
    found = re.search(r"<!-- systemd-install:[^>]*-->\s*```sh\n(.*?)```", guide, re.DOTALL)
    assert found is not None, "the guide's systemd install steps are missing"
    # One command a line: continuation lines joined.
    return found.group(1).replace("\\\n", " ")


def installed_at(steps: str, source: Path) -> str:
    found = re.search(rf"^install -m \d+ {source.relative_to(ROOT)} (\S+)$", steps, re.MULTILINE)
    assert found is not None, f"the guide does not install {source.relative_to(ROOT)}"
    return found.group(1)


def unit_setting(unit: str, key: str) -> str:
    found = re.search(rf"^{key}=(.+)$", unit, re.MULTILINE)
    assert found is not None, key
    return found.group(1).strip()


def test_the_systemd_guide_installs_what_the_unit_runs() -> None:
    steps = systemd_install_steps()
    unit = SYSTEMD.read_text(encoding="utf-8")
    user = re.search(r"^useradd .* (\S+)$", steps, re.MULTILINE)
    assert user is not None and user.group(1) == unit_setting(unit, "User")
    venv = re.search(r"^python3 -m venv (\S+)$", steps, re.MULTILINE)
    assert venv is not None
    command = unit_setting(unit, "ExecStart").split()
    assert command[0] == f"{venv.group(1)}/bin/fenceproxy"
    assert command[command.index("--config") + 1] == installed_at(steps, SYSTEMD_POLICY)
    environment_file = unit_setting(unit, "EnvironmentFile")
    assert f"install -m 0600 /dev/null {environment_file}" in steps
    assert "systemctl daemon-reload" in steps
    assert "systemctl enable --now fenceproxy" in steps
    # The service writes only its StateDirectory: the store must be there.
    state = f"/var/lib/{unit_setting(unit, 'StateDirectory')}"
    store = parse_policy(SYSTEMD_POLICY.read_text(encoding="utf-8"), str(SYSTEMD_POLICY)).store
    assert store.startswith(f"sqlite:///{state}/"), store


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    units = Path("/usr/lib/systemd/system")
    if analyze is None or not units.is_dir():
        missing("systemd-analyze not installed (Debian's systemd package; .ci/run installs it)")
    steps = systemd_install_steps()
    unit = SYSTEMD.read_text(encoding="utf-8")
    # A root of its own: the unit and its ExecStart where the guide puts them, and the
    # host's system units (the targets the unit orders itself after), without
    # installing anything on this machine.
    root = tmp_path / "root"
    shutil.copytree(units, root / units.relative_to("/"), symlinks=True)
    destination = root / installed_at(steps, SYSTEMD).lstrip("/")
    destination.parent.mkdir(parents=True)
    destination.write_text(unit, encoding="utf-8")
    venv = re.search(r"^python3 -m venv (\S+)$", steps, re.MULTILINE)
    assert venv is not None
    executable = root / venv.group(1).lstrip("/") / "bin" / "fenceproxy"
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\n", encoding="utf-8")
    executable.chmod(0o755)
    # The unit's other commands (ExecReload's kill) are the system's: the host's own.
    for command in re.findall(r"^Exec\w+=[-@:+!]*(/\S+)", unit, re.MULTILINE):
        placed = root / command.lstrip("/")
        if not placed.exists():
            placed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(command).resolve(), placed)
    checked = subprocess.run(
        [analyze, "verify", f"--root={root}", installed_at(steps, SYSTEMD)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert checked.returncode == 0 and not checked.stderr.strip(), checked.stderr


def test_alert_rules_name_metrics_the_proxy_exports() -> None:
    exported = {
        sample
        for family in Metrics().registry.collect()
        for sample in {family.name, f"{family.name}_total"}
    }
    rules = [rule for group in documents(ALERTS)[0]["groups"] for rule in group["rules"]]
    assert rules
    for rule in rules:
        named = set(re.findall(r"\bfenceproxy_[a-z_]+", rule["expr"]))
        assert named <= exported, (rule["alert"], named - exported)
    documented = set(re.findall(r"^\| `(Fenceproxy\w+)`", GUIDE.read_text(), re.MULTILINE))
    assert documented == {rule["alert"] for rule in rules}


def test_alert_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool not installed (Debian's prometheus package; .ci/run installs it)")
    checked = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_guide_links_files_that_exist() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (GUIDE.parent / target).resolve().exists(), target
    # Files outside the docs site are named, not linked (mkdocs --strict refuses links
    # out of docs/): each one named must exist.
    named = re.findall(r"`(examples/[^`\s]+)`", text)
    assert named
    for path in named:
        assert (ROOT / path).exists(), path
