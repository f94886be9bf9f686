"""`fenceproxy reload`: ask a running replica to read its policy file again.

Unlike the store commands it needs the proxy up: it calls the replica's admin API
(`POST /_fence/v1/admin/reload`, with the policy's admin token), as a probe needs
the upstream; the answer, or the refusal and why, is the replica's own. `kill -HUP`
of the serve process does the same and only logs the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import urllib.error
import urllib.request

from proxy.auth import env_secret
from proxy.cli_store import CommandError, policy_of
from proxy.terminal import printable

RELOAD_PATH = "/_fence/v1/admin/reload"
TIMEOUT_S = 30.0
# A listener on every address is reached on this host's loopback.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def replica_url(args: argparse.Namespace) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    listen = policy_of(args).listen
    host = WILDCARDS.get(listen.host, listen.host)
    if ":" in host:
        host = f"[{host}]"
    port = args.port if args.port is not None else listen.port
    return f"{'https' if listen.tls is not None else 'http'}://{host}:{port}"


def reload(args: argparse.Namespace) -> int:
    policy = policy_of(args)
    env = policy.admin_token_env
    token = env_secret(os.environ, env) if env else None
    if token is None:
        raise CommandError(
            f"no admin token: set ${env}" if env else "the policy has no admin_token_env"
        )
    url = replica_url(args) + RELOAD_PATH
    request = urllib.request.Request(
        url,
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=args.cafile) if args.cafile else None
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as answer:
            body = json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        try:
            problem = json.loads(refused.read())
            detail = f"{problem.get('detail')} ({problem.get('code')})"
        except ValueError:
            detail = f"HTTP {refused.code}"
        raise CommandError(f"{url}: {printable(detail)}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CommandError(f"{url}: no answer: {exc}") from None
    if args.json:
        print(json.dumps(body, indent=2, sort_keys=True))
        return 0
    how = "reloaded" if body["changed"] else "unchanged"
    print(f"{printable(str(body['file']))}: {how}, sha256 {body['digest']}")
    return 0
