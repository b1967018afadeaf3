"""The inspector (``http.inspector: true``; off by default): a read-only page at ``/inspector/``
that shows the caller's conversations, their transcripts and each turn's timeline as a Gantt
chart (docs/inspector.md).

The door serves static files only: the page built at release time from
``clients/inspector`` (``make build-inspector``: TypeScript compiled by the repository's own
``tsc``, no framework, no CDN) into :data:`PAGE_DIR`. The page reads everything through the
Connect door with the bearer token the user gives it (sent in the ``authorization`` header,
never a cookie), so it sees exactly what the API shows that token's tenant: ListConversations,
GetConversation, ListTurns and ResumeTurn for a running turn's live tail. No data is served
here, so there is nothing here to authorize.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

log = logging.getLogger("turnwire.http")

PAGE_DIR: Final = Path(__file__).parent / "inspector_page"
"""Where the built page is (``index.html``, ``inspector.css``, ``inspector.js``)."""

_FILES: Final = {
    "": ("index.html", "text/html; charset=utf-8"),
    "index.html": ("index.html", "text/html; charset=utf-8"),
    "inspector.css": ("inspector.css", "text/css; charset=utf-8"),
    "inspector.js": ("inspector.js", "text/javascript; charset=utf-8"),
}
"""The page's files by path under ``/inspector/``: a fixed list, so no request names a file."""

_HEADERS: Final = {
    # The page loads nothing from elsewhere and is framed by no one.
    "content-security-policy": "default-src 'self'; img-src 'self' data: blob:; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def page_built() -> bool:
    """True when the page's files are in :data:`PAGE_DIR`."""
    return all((PAGE_DIR / name).is_file() for name, _ in _FILES.values())


def inspector_routes() -> list[Route]:
    """``GET /inspector`` (redirect) and ``GET /inspector/<file>`` for the page's files; 503 with
    what to do when the page was not built."""
    if not page_built():
        log.warning("http.inspector: the page is not built (%s); run `make build-inspector`", PAGE_DIR)

    async def page(request: Request) -> Response:
        found = _FILES.get(request.path_params.get("file", ""))
        if found is None:
            return PlainTextResponse("not found\n", status_code=404)
        name, media_type = found
        path = PAGE_DIR / name
        if not path.is_file():
            return PlainTextResponse(
                "the inspector page is not built: run `make build-inspector`\n", status_code=503
            )
        return FileResponse(path, media_type=media_type, headers=_HEADERS)

    async def slash(_: Request) -> Response:
        return RedirectResponse("/inspector/", status_code=308)

    return [
        Route("/inspector", slash, methods=["GET"]),
        Route("/inspector/", page, methods=["GET"]),
        Route("/inspector/{file}", page, methods=["GET"]),
    ]


__all__ = ["PAGE_DIR", "inspector_routes", "page_built"]
