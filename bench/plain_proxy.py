"""A plain aiohttp pass-through reverse proxy: the benchmark's baseline.

    python -m bench.plain_proxy --port P --upstream http://127.0.0.1:9001

It does what any aiohttp reverse proxy must (buffer the body, drop hop-by-hop
headers, one pooled client session) and nothing else, so the difference to
fenceproxy is the price of fencing.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.forwarding import HOP_BY_HOP, connection_tokens

# The hop-by-hop list is the proxy's own (RFC 9110 section 7.6.1), so the baseline
# drops what fenceproxy drops; plus the framing the client library sets itself for the
# body it actually sends.
DROPPED = HOP_BY_HOP | {"host", "content-length"}
UPSTREAM_TIMEOUT = aiohttp.ClientTimeout(total=5, connect=1)

UPSTREAM_URL = web.AppKey("upstream_url", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def end_to_end_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The headers without hop-by-hop ones, including any the Connection header names."""
    dropped = DROPPED | connection_tokens(headers)
    return CIMultiDict(
        (name, value) for name, value in headers.items() if name.lower() not in dropped
    )


async def forward(request: web.Request) -> web.Response:
    body = await request.read()
    try:
        async with request.app[SESSION].request(
            request.method,
            request.app[UPSTREAM_URL] + request.path_qs,
            headers=end_to_end_headers(request.headers),
            data=body,
        ) as upstream:
            return web.Response(
                status=upstream.status,
                headers=end_to_end_headers(upstream.headers),
                body=await upstream.read(),
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        return web.json_response({"error": "bad_gateway", "detail": type(exc).__name__}, status=502)


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    # No connection cap (limit=0): the baseline must not queue where
    # fenceproxy would not. Bodies pass through still encoded.
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=UPSTREAM_TIMEOUT,
        auto_decompress=False,
    ) as session:
        app[SESSION] = session
        yield


def make_app(upstream_url: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM_URL] = upstream_url.rstrip("/")
    app.cleanup_ctx.append(_client_session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plain_proxy", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9001")
    args = parser.parse_args()
    web.run_app(make_app(args.upstream), host=args.host, port=args.port, access_log=None)


if __name__ == "__main__":
    main()
