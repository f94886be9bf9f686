"""The operator's status page: GET /_fence/ui/ on the proxy's own port.

The page is a shell rendered by jinja2 (autoescaped) that holds no store data: its
script (static/status.js) asks for a key once, keeps it in the tab's sessionStorage
and reads everything from the admin API with `Authorization: Bearer`, so the page
shows nothing to whoever merely reaches the port, and shows what the key may read.
Every value from the store is put in the page as text (textContent), never as markup.
Everything is served from here: no CDN, no build step.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import hdrs, web

from core.codes import ErrorCode
from core.records import Refusal
from proxy.auth import take_credentials

PREFIX = "/_fence/ui"
_HERE = Path(__file__).parent
TEMPLATES = _HERE / "templates"
STATIC = _HERE / "static"
# The page's files, by name, and nothing else: a static route would also answer for the
# folder (403), for paths below it and for files added to it later.
STATIC_FILES = {
    "status.js": "text/javascript",
    "status.css": "text/css",
    "favicon.svg": "image/svg+xml",
}

# Only this origin's own files; no inline script or style, no framing, no form posts
# (actions are fetch() calls the script makes), nothing sent to another origin.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    # The shell carries no data, but a cached copy would outlive a changed policy.
    "Cache-Control": "no-store",
}


def add_routes(app: web.Application) -> None:
    aiohttp_jinja2.setup(
        app,
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    app.router.add_get(PREFIX, to_page)
    app.router.add_get(f"{PREFIX}/", page)
    app.router.add_get(f"{PREFIX}/static/{{name}}", static_file)
    app.on_response_prepare.append(_security_headers)


async def static_file(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    content_type = STATIC_FILES.get(name)
    if content_type is None:
        raise Refusal(ErrorCode.NO_ROUTE, f"the status page has no file {name!r}")
    return web.FileResponse(STATIC / name, headers={hdrs.CONTENT_TYPE: content_type})


async def to_page(request: web.Request) -> web.Response:
    raise web.HTTPFound(f"{PREFIX}/")


@aiohttp_jinja2.template("status.html")
async def page(request: web.Request) -> dict[str, object]:
    return {
        "admin_api_on": take_credentials(request).admin_api_on,
        "auth_clients": take_credentials(request).required,
        "static": f"{PREFIX}/static",
    }


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every answer under the page's prefix: the page, its files, their errors."""
    if request.path == PREFIX or request.path.startswith(f"{PREFIX}/"):
        response.headers.update(SECURITY_HEADERS)
