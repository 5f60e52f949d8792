"""The web UI: plain HTML, CSS and JavaScript files in this folder, served under ``{base}/``.

There is no build step. The page is one document for the browser, kept in the source as a
skeleton (``index.html``) and one file per view, dialog or template (``parts/NAME.html``), each
put in place of its ``<!-- part: NAME -->`` line once, when the UI is built: a view is added as a
part and one line, not as more lines in one long page. The page talks to the admin API with
relative URLs (``api/...``), so it works under any ``base_path``. Only the UI's own file types are served (not this module), each
answer carries a strict Content-Security-Policy, and browsers revalidate files on every load so
an upgraded dgxmm is picked up at once.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

WEB_DIR = Path(__file__).resolve().parent
SERVED_SUFFIXES = frozenset({".html", ".css", ".js", ".svg"})
PAGES = frozenset({"/", "/index.html"})
PART = re.compile(r"^[ \t]*<!-- part: ([a-z0-9-]+) -->[ \t]*$", re.MULTILINE)


def assemble(directory: Path) -> bytes:
    """``index.html`` with each part line replaced by ``parts/NAME.html``. A part that is missing
    raises here, when dgxmm starts, rather than leaving a page without its view."""
    page = (directory / "index.html").read_text(encoding="utf-8")

    def part(match: re.Match[str]) -> str:
        return (directory / "parts" / f"{match.group(1)}.html").read_text(encoding="utf-8").rstrip("\n")

    return PART.sub(part, page).encode()


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
HEADERS_TEXT = [(name.decode(), value.decode()) for name, value in HEADERS]


class WebUI:
    """ASGI app for the UI's files, meant to be mounted at ``{base}`` after the API routers."""

    def __init__(self, directory: Path = WEB_DIR) -> None:
        self.files = StaticFiles(directory=directory, html=True)
        self.page = assemble(directory)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # The folder is flat: a trailing '/' is only the root's (index.html). Anything else
            # ending in '/' would let StaticFiles serve the file before it (``__init__.py/``).
            path: str = scope["path"]
            relative = path.removeprefix(scope.get("root_path", ""))
            name = PurePosixPath(path).name
            if (
                (relative.endswith("/") and relative != "/")
                or (relative != "/" and PurePosixPath(name).suffix not in SERVED_SUFFIXES)
                or relative.count("/") > 1  # parts/ are pieces of the page, not pages
            ):
                raise HTTPException(404, "Not Found")
            if relative in PAGES:
                if scope["method"] not in ("GET", "HEAD"):
                    raise HTTPException(405, "Method Not Allowed")
                page = Response(self.page, media_type="text/html", headers=dict(HEADERS_TEXT))
                await page(scope, receive, send)
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.files(scope, receive, send_with_headers)
