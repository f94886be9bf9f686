"""A fenced worker, run as its own OS process by the process tests.

    python tests/integration/processes/worker.py --proxy URL --resource R --holder H \
        --ttl S --method PUT --path /rules/r1 [--acquire-timeout S] \
        [--header NAME:VALUE ...]

It acquires a lease on R (retrying `lease_held` refusals for up to
--acquire-timeout seconds), reads the proxy's lease view for R right after the
grant, and prints one JSON line per step, flushed at once:

    {"event": "acquire_refused", "status", "code", "retry_after", "at"}
    {"event": "acquired", "epoch", "token", "expires_at", "ttl_s", "attempts",
     "view": <GET /_fence/v1/leases right after the 201>, "at"}
    {"event": "acquire_failed", "status", "code"}            (then exit 1)

Then it reads commands from stdin, one per line, until EOF:

    write <json-body> <idempotency-key>   the fenced mutation (METHOD PATH with
                                           Fence-Token and Idempotency-Key)
    -> {"event": "wrote", "status", "code", "fence_epoch", "replayed", "body", "at"}
       (replayed: the Idempotent-Replayed header, or null)
    decide <json-body> <idempotency-key>  approve an operation and keep it, unsent
    -> {"event": "decided", "epoch", "body", "idempotency_key", "at"}
    send                                   send the decided operation as `write` does
    -> {"event": "wrote", ...}
    hold <seconds>                         work: a real sleep, the turn's known length
    -> {"event": "held", "seconds", "at"}
    renew <ttl_s>                          POST /_fence/v1/leases/renew with the token
    -> {"event": "renewed", "status", "code", "at"}
    release                                POST /_fence/v1/leases/release with the token
    -> {"event": "released", "status", "code", "at"}

"acquired" also says when the 201 arrived (`granted_at`, this process's clock).

Every --header is added to each write (the demo upstream's fault knobs).

Only the standard library, so it starts fast.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from typing import Any
from urllib.parse import quote, urlsplit

RETRY_INTERVAL_S = 0.05


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Proxy:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80

    def call(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            raw = response.read()
            received = {name.lower(): value for name, value in response.getheaders()}
            status = response.status
        finally:
            connection.close()
        try:
            decoded: Any = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode("utf-8", errors="replace")
        return status, decoded, received


def code_of(body: Any) -> str | None:
    if isinstance(body, dict):
        code = body.get("code")
        return code if isinstance(code, str) else None
    return None


def acquire(proxy: Proxy, args: argparse.Namespace) -> dict[str, Any] | None:
    request = json.dumps({"resource": args.resource, "holder": args.holder, "ttl_s": args.ttl})
    deadline = time.monotonic() + args.acquire_timeout
    attempts = 0
    while True:
        attempts += 1
        status, body, headers = proxy.call(
            "POST",
            "/_fence/v1/leases",
            request.encode(),
            {"Content-Type": "application/json"},
        )
        if status == 201 and isinstance(body, dict):
            lease: dict[str, Any] = body
            lease["attempts"] = attempts
            lease["granted_at"] = time.time()
            return lease
        code = code_of(body)
        if code != "lease_held" or time.monotonic() >= deadline:
            emit("acquire_failed", status=status, code=code, body=body)
            return None
        emit(
            "acquire_refused",
            status=status,
            code=code,
            retry_after=headers.get("retry-after"),
            at=time.time(),
        )
        time.sleep(RETRY_INTERVAL_S)


def lease_command(proxy: Proxy, token: str, command: str, argument: str) -> None:
    if command == "hold":
        seconds = float(argument)
        time.sleep(seconds)
        emit("held", seconds=seconds, at=time.time())
        return
    body = {"ttl_s": float(argument)} if command == "renew" else {}
    status, answer, _ = proxy.call(
        "POST",
        f"/_fence/v1/leases/{command}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Fence-Token": token},
    )
    done = {"renew": "renewed", "release": "released"}[command]
    emit(done, status=status, code=code_of(answer), at=time.time())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--proxy", required=True)
    parser.add_argument("--resource", required=True)
    parser.add_argument("--holder", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--method", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--acquire-timeout", type=float, default=0.0)
    parser.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    args = parser.parse_args()
    extra_headers = {name: value for name, _, value in (h.partition(":") for h in args.header)}
    proxy = Proxy(args.proxy)

    lease = acquire(proxy, args)
    if lease is None:
        return 1
    # What the proxy's store says the moment this worker learns it owns the resource.
    _, view, _ = proxy.call(
        "GET", f"/_fence/v1/leases?resource={quote(args.resource, safe='')}", None, {}
    )
    emit(
        "acquired",
        epoch=lease["epoch"],
        token=lease["token"],
        expires_at=lease["expires_at"],
        ttl_s=lease["ttl_s"],
        attempts=lease["attempts"],
        granted_at=lease["granted_at"],
        view=view,
        at=time.time(),
    )

    decided: tuple[str, str] | None = None
    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "decide":
            body, _, key = rest.rpartition(" ")
            decided = (body, key)
            emit("decided", epoch=lease["epoch"], body=body, idempotency_key=key, at=time.time())
            continue
        if command in ("hold", "renew", "release"):
            lease_command(proxy, lease["token"], command, rest)
            continue
        if command == "send" and decided is not None:
            body, key = decided
        elif command == "write":
            body, _, key = rest.rpartition(" ")
        else:
            emit("error", detail=f"unknown command {command!r}")
            continue
        status, answer, headers = proxy.call(
            args.method,
            args.path,
            body.encode(),
            {
                **extra_headers,
                "Content-Type": "application/json",
                "Fence-Token": lease["token"],
                "Idempotency-Key": key,
            },
        )
        emit(
            "wrote",
            status=status,
            code=code_of(answer),
            fence_epoch=headers.get("fence-epoch"),
            replayed=headers.get("idempotent-replayed"),
            body=answer,
            at=time.time(),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
