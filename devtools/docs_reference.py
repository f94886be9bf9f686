"""The generated pages of the docs site, from the code they describe.

`python -m devtools.docs_reference` (`make docs`) writes them; `--check` says which
differ from what is checked in (tests/unit/test_docs_reference.py runs it). They are
checked in, not made at build time: they read on GitHub and in a review's diff as
they are, and `mkdocs build` never imports the proxy.

* docs/reference/configuration.md: every key of the policy file, found by asking the
  policy loader itself (`policies.loading.parse_policy`) which keys each block
  allows, so a key added to the loader without a line in devtools/docs_configuration.py fails
  the generator; its defaults are read from a parsed minimal policy, those of `upstreams`
  and `routes` from their declarations (policies/route_keys.py); and every
  environment variable the proxy reads (`ENVIRONMENT`, checked against the
  `FENCEPROXY_*` names in the shipped packages' source).
* docs/reference/cli.md: the argparse parser (`proxy.cli.build_parser`).
* docs/reference/openapi.md: the OpenAPI document (`proxy.openapi.document`).
* docs/reference/errors.md: the error code table (`core.codes.ErrorCode`).
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import functools
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from core.codes import ErrorCode
from devtools.docs_configuration import CONFIGURATION, ENVIRONMENT, Key
from policies.loading import parse_policy
from policies.model import Policy
from policies.nodes import ConfigError
from policies.reloading import RESTART_KEYS
from proxy.cli import build_parser
from proxy.openapi import document

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
EXAMPLE_POLICY = ROOT / "config" / "example.yaml"
# The packages the wheel ships (pyproject.toml): the environment variables they read.
SHIPPED = ("policies", "core", "store", "proxy", "reconcile")

# --- the policy file's keys, as the loader knows them ---------------------------------------

_PROBE = "zz_probe_key"
_UNKNOWN = re.compile(r"unknown key\b.*\(allowed: (.*)\)\Z")
Path_ = tuple[str | int, ...]


def _dotted(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _with_probe(data: Any, path: Path_) -> Any:
    """A copy of `data` with an unknown key in the mapping at `path`, made if missing
    (and replacing whatever else is there)."""
    data = copy.deepcopy(data)
    holder = data
    for index, part in enumerate(path):
        following = path[index + 1] if index + 1 < len(path) else None
        kind: type[Any] = list if isinstance(following, int) else dict
        if isinstance(part, int):
            while len(holder) <= part:
                holder.append({})
        if not isinstance(holder[part] if isinstance(part, int) else holder.get(part), kind):
            holder[part] = kind()
        holder = holder[part]
    holder[_PROBE] = 1
    return data


def _allowed_at(base: Any, path: Path_) -> list[str] | None:
    """The keys the loader allows in the mapping at `path`, or None if it is no block."""
    data = _with_probe(base, path)
    try:
        parse_policy(yaml.safe_dump(data, sort_keys=False), "<probe>", ROOT / "config")
    except ConfigError as error:
        where = _dotted((*path, _PROBE))
        for problem in error.problems:
            found = _UNKNOWN.match(problem.message)
            if problem.key == where and found:
                return found.group(1).split(", ")
    return None


@functools.cache  # a few hundred parses of the example policy: once per process
def policy_keys() -> tuple[str, ...]:
    """Every key of the policy file, as `a.b`, `routes[].x` and `upstreams.NAME.x`."""
    base = yaml.safe_load(EXAMPLE_POLICY.read_text(encoding="utf-8"))
    keys: list[str] = []

    def walk(path: Path_, shown: str) -> None:
        allowed = _allowed_at(base, path)
        assert allowed is not None, f"{shown or 'the top level'} is not a block"
        for name in allowed:
            child_shown = f"{shown}.{name}" if shown else name
            keys.append(child_shown)
            child: Path_ = (*path, name)
            existing = _lookup(base, child)
            if existing is not None and not isinstance(existing, dict | list):
                continue  # the example holds a plain value there: no block
            if isinstance(existing, list) and not any(isinstance(e, dict) for e in existing):
                continue  # a list of plain values
            if _allowed_at(base, child) is not None:
                walk(child, child_shown)
            elif _allowed_at(base, (*child, 0)) is not None:
                walk((*child, 0), f"{child_shown}[]")
            else:
                entry = next(iter(existing), "NAME") if isinstance(existing, dict) else "NAME"
                if _allowed_at(base, (*child, entry)) is not None:
                    walk((*child, entry), f"{child_shown}.NAME")

    walk((), "")
    return tuple(keys)


def _lookup(data: Any, path: Path_) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


# What a minimal policy gets for what it leaves out: the defaults, read back.
_MINIMAL_POLICY = """\
version: 1
upstreams: {NAME: {url: "http://127.0.0.1:9001"}}
routes:
  - name: r
    upstream: NAME
    match: {methods: [PUT], path: "/x/{id}"}
    resource: "x:{id}"
    reconcile: {probe: {path: "/x/{id}"}, committed: ["200"], not_committed: ["404"]}
"""


def _default_text(key: Key, minimal: Policy) -> str:
    if isinstance(key.default, str):
        return key.default
    value = key.default(minimal)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


_NAMED_BY_POLICY = (
    "| named by `admin_token_env` (the example: `FENCEPROXY_ADMIN_TOKEN`) | the admin token |\n"
    "| named by `admin_token_next_env` | a second admin token, during a rotation |\n"
    "| named by `auth.clients[].key_env` | that client's key |\n"
)
_ENV_NAME = re.compile(r"FENCEPROXY_[A-Z0-9_]+\Z")


def environment_variables_read() -> set[str]:
    """The `FENCEPROXY_*` names the shipped packages' source spells: each one is read."""
    names = set()
    for package in SHIPPED:
        for source in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and _ENV_NAME.match(node.value)
                ):
                    names.add(node.value)
    return names


# --- the pages ------------------------------------------------------------------------------

GENERATED = "<!-- generated by devtools/docs_reference.py (`make docs`); do not edit -->\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def configuration_page() -> str:
    keys = policy_keys()
    missing = [key for key in keys if key not in CONFIGURATION]
    stale = [key for key in CONFIGURATION if key not in keys]
    if missing or stale:
        raise SystemExit(
            "devtools/docs_reference.py CONFIGURATION is out of step with the policy loader: "
            f"undocumented {missing}, no longer allowed {stale}"
        )
    read = environment_variables_read()
    if read != set(ENVIRONMENT):
        raise SystemExit(
            "devtools/docs_reference.py ENVIRONMENT is out of step with the source: read "
            f"but undocumented {sorted(read - set(ENVIRONMENT))}, documented but not read "
            f"{sorted(set(ENVIRONMENT) - read)}"
        )
    minimal = parse_policy(_MINIMAL_POLICY)
    example = EXAMPLE_POLICY.read_text(encoding="utf-8").rstrip()
    rows = "".join(
        f"| `{key}` | {_default_text(described, minimal)} | {_cell(described.meaning)} |\n"
        for key, described in CONFIGURATION.items()
    )
    environment = "".join(f"| `{name}` | {_cell(ENVIRONMENT[name])} |\n" for name in ENVIRONMENT)
    return (
        f"{GENERATED}\n# Configuration\n\n"
        "One YAML file, the *policy*: `fenceproxy serve --config FILE` (or "
        "`FENCEPROXY_CONFIG`). `fenceproxy check-config FILE` prints every problem at once, "
        "each as `file:line: key.path: message`; an unknown key is one of them, naming the "
        "nearest valid key when one is close (`unknown key: did you mean 'timeout_s'?`). A "
        "value of the wrong type is one problem: no rule then reports the default that "
        "stands in for it. YAML the parser cannot read is `file:line: <file>: not valid YAML "
        "at column N:` and what the file needed there (a closing bracket or quote, one "
        "indentation per mapping, quotes around a value holding `: `). How routes "
        "turn paths into resources: [routes](routes.md).\n\n"
        "A running proxy reads the file again on `fenceproxy reload` or SIGHUP; a change to "
        f"{', '.join(f'`{key}`' for key in RESTART_KEYS)} needs a restart, and such a reload "
        "is refused with nothing changed ([Changing the policy without a restart]"
        "(../how-to/deployment.md#changing-the-policy-without-a-restart)).\n\n"
        "## The example (`config/example.yaml`)\n\n"
        f"```yaml\n{example}\n```\n\n"
        "## Every key\n\n"
        "`NAME` stands for an upstream's name, `[]` for each element of a list. A default "
        "in `code` is what the proxy uses when the key is absent.\n\n"
        "| key | default | meaning |\n|---|---|---|\n"
        f"{rows}\n"
        "## Environment variables\n\n"
        "| variable | meaning |\n|---|---|\n"
        f"{environment}{_NAMED_BY_POLICY}\n"
        "A secret's value is taken without surrounding whitespace; a variable that is unset, "
        "empty or whitespace only counts as not set.\n"
    )


def _option_text(action: argparse.Action) -> str:
    if action.option_strings:
        value = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        return ", ".join(f"`{name}{value}`" for name in action.option_strings)
    optional = " (optional)" if action.nargs == "?" else ""
    return f"`{action.metavar or action.dest.upper()}`{optional}"


def _commands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    # argparse has no public way to list a parser's actions; tests/unit/test_cli_help.py
    # walks the same private names, and pins them.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name) or "", sub
                yield from _commands(sub, f"{prefix} {name}")


def cli_page() -> str:
    parser = build_parser()
    parts = [
        f"{GENERATED}\n# CLI\n\n"
        "Every command needs the policy file: `--config FILE`, or `FENCEPROXY_CONFIG=FILE` "
        "in the environment (without either, it stops with `no policy file: pass --config "
        "FILE or set FENCEPROXY_CONFIG`). Every command but `serve` and `reload` works on "
        "the store directly (so it works while the proxy is down); `reload` asks a running "
        "replica, through its admin API, to read its policy file again. Each prints a "
        "table or `--json` where it has one, and exits non-zero with a one-line reason on "
        "failure. "
        "A reader that goes away (`| head`, `| grep -q`) ends any command quietly with "
        "exit status 141, as a shell reports a process killed by SIGPIPE. "
        "`fenceproxy --version` prints the version. With `make run`, "
        "`export FENCEPROXY_CONFIG=state/fenceproxy.yaml`.\n"
    ]
    for name, help_text, sub in _commands(parser, "fenceproxy"):
        rows = [
            f"| {_option_text(action)} | {_cell(action.help or '')}"
            f"{' (required)' if action.required and action.option_strings else ''} |"
            for action in sub._actions
            if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        ]
        # A fixed width: the usage lines must not depend on the terminal that runs this.
        sub.formatter_class = functools.partial(argparse.HelpFormatter, width=88)
        usage = sub.format_usage().removeprefix("usage: ").rstrip()
        described = help_text[:1].upper() + help_text[1:]
        parts.append(f"\n## `{name}`\n\n{described}.\n\n```\n{usage}\n```\n")
        if rows:
            parts.append("\n| argument | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "".join(parts)


def errors_page() -> str:
    rows = "".join(
        f"| `{code.value}` | {code.status} | {_cell(code.when)} |\n" for code in ErrorCode
    )
    return (
        f"{GENERATED}\n# Error codes\n\n"
        'Every refusal is `application/problem+json` (RFC 9457): `{"type", "title", '
        '"status", "detail", "code", ...context}`, where `type` is '
        "`https://fenceproxy.dev/problems/<code>` and the context names the resource, "
        "epochs or effect ids involved. The worker client raises one exception class per "
        "code ([writing a worker](../how-to/write-a-worker.md)).\n\n"
        "| code | status | when |\n|---|---|---|\n"
        f"{rows}"
    )


def _schema_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    kind = schema.get("type", "object" if "properties" in schema else "any")
    text = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if "enum" in schema:
        text += ": " + ", ".join(f"`{value}`" for value in schema["enum"])
    bounds = [
        f"{label} {schema[name]}"
        for name, label in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("minLength", "length ≥"),
            ("maxLength", "length ≤"),
        )
        if name in schema
    ]
    if "pattern" in schema:
        bounds.append(f"pattern `{schema['pattern']}`")
    if bounds:
        text += " (" + ", ".join(bounds) + ")"
    return text


def _fields(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", ()))
    rows = [
        f"| `{name}` | {_cell(_schema_text(field))} | {'yes' if name in required else 'no'} | "
        f"{_cell(field.get('description', ''))} |"
        for name, field in schema.get("properties", {}).items()
    ]
    if not rows:
        return ""
    return "| field | type | required | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def openapi_page() -> str:
    spec = document()
    parts = [
        f"{GENERATED}\n# OpenAPI: every operation\n\n"
        f"`GET /_fence/v1/openapi.json` serves this document (OpenAPI {spec['openapi']}); "
        "this page is made from it. The [HTTP API](http-api.md) page says who may call "
        "what.\n\nCredentials, as an operation lists them (`none`: it may be called "
        "without one):\n\n"
        + "".join(
            f"* `{name}`: {scheme.get('description', '')}\n"
            for name, scheme in spec["components"]["securitySchemes"].items()
        )
    ]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            parts.append(f"\n## `{method.upper()} {path}`\n\n")
            if operation.get("summary"):
                parts.append(f"{operation['summary'][0].upper()}{operation['summary'][1:]}.\n\n")
            if operation.get("description"):
                parts.append(f"{operation['description']}\n\n")
            security = operation.get("security")
            if security is not None:
                names = [next(iter(entry), "") or "none" for entry in security]
                parts.append(f"Credentials: {', '.join(f'`{name}`' for name in names)}.\n\n")
            parameters = operation.get("parameters", [])
            if parameters:
                parts.append(
                    "| parameter | in | type | required | meaning |\n|---|---|---|---|---|\n"
                )
                for parameter in parameters:
                    parts.append(
                        f"| `{parameter['name']}` | {parameter['in']} | "
                        f"{_cell(_schema_text(parameter.get('schema', {})))} | "
                        f"{'yes' if parameter.get('required') else 'no'} | "
                        f"{_cell(parameter.get('description', ''))} |\n"
                    )
                parts.append("\n")
            body = operation.get("requestBody")
            if body is not None:
                schema = body["content"]["application/json"]["schema"]
                parts.append("Body (JSON):\n\n" + (_fields(schema) or "`{}`\n") + "\n")
            parts.append("| status | answer |\n|---|---|\n")
            for status, response in operation["responses"].items():
                parts.append(f"| {status} | {_cell(response.get('description', ''))} |\n")
    parts.append("\n## Schemas\n")
    for name, schema in spec["components"]["schemas"].items():
        parts.append(f"\n### {name}\n\n")
        if schema.get("description"):
            parts.append(f"{schema['description']}\n\n")
        parts.append(_fields(schema) or f"```json\n{json.dumps(schema, indent=2)}\n```\n")
    return "".join(parts)


PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": configuration_page,
    "cli.md": cli_page,
    "errors.md": errors_page,
    "openapi.md": openapi_page,
}


def stale_pages() -> dict[str, str]:
    """Each generated page whose checked-in text differs, with the difference."""
    differences = {}
    for name, render in PAGES.items():
        path = REFERENCE / name
        written = path.read_text(encoding="utf-8") if path.exists() else ""
        wanted = render()
        if written != wanted:
            differences[name] = "".join(
                difflib.unified_diff(
                    written.splitlines(keepends=True),
                    wanted.splitlines(keepends=True),
                    f"docs/reference/{name}",
                    "generated",
                )
            )
    return differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="only say which pages differ")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for difference in stale.values():
            sys.stdout.write(difference)
        return 1 if stale else 0
    for name, render in PAGES.items():
        (REFERENCE / name).write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
