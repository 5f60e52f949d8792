"""The web UI: plain HTML, CSS and JavaScript files in this folder, served under ``{base}/``.

There is no build step. The page talks to the admin API with relative URLs (``api/...``), so it
works under any ``base_path``. Only the UI's own file types are served (not this module), each
answer carries a strict Content-Security-Policy, and browsers revalidate files on every load so
an upgraded dgxmm is picked up at once.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from starlette.exceptions import HTTPException
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

WEB_DIR = Path(__file__).resolve().parent
SERVED_SUFFIXES = frozenset({".html", ".css", ".js", ".svg"})

HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


class WebUI:
    """ASGI app for the UI's files, meant to be mounted at ``{base}`` after the API routers."""

    def __init__(self, directory: Path = WEB_DIR) -> None:
        self.files = StaticFiles(directory=directory, html=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # The folder is flat: a trailing '/' is only the root's (index.html). Anything else
            # ending in '/' would let StaticFiles serve the file before it (``__init__.py/``).
            path: str = scope["path"]
            relative = path.removeprefix(scope.get("root_path", ""))
            name = PurePosixPath(path).name
            if (relative.endswith("/") and relative != "/") or (
                relative != "/" and PurePosixPath(name).suffix not in SERVED_SUFFIXES
            ):
                raise HTTPException(404, "Not Found")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.files(scope, receive, send_with_headers)
