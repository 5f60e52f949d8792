"""The web UI's files as dgxmm serves them, without a browser: the mount under the base path, the
redirect, headers, and that the API and the on-demand gateway still answer as before."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from conftest import gateway_settings, make_settings

from dgxmm.web import assemble

WEB = Path(__file__).resolve().parents[2] / "src" / "dgxmm" / "web"
pytestmark = pytest.mark.timeout(60)


async def test_ui_is_served_under_the_base_path(serve) -> None:
    svc = await serve()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.settings.server.port}") as anon:
        resp = await anon.get("/dgxmm")
        assert resp.status_code in (307, 308) and resp.headers["location"].endswith("/dgxmm/")
        page = await anon.get("/dgxmm/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "<title>dgxmm</title>" in page.text
        assert 'id="deploy-dialog"' in page.text and "<!-- part:" not in page.text
        assert (await anon.get("/dgxmm/index.html")).text == page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        for name, kind in (
            ("app.js", "javascript"),
            ("api.js", "javascript"),
            ("style.css", "text/css"),
            ("views.css", "text/css"),
            ("favicon.svg", "image/svg+xml"),
        ):
            resp = await anon.get(f"/dgxmm/{name}")
            assert resp.status_code == 200 and kind in resp.headers["content-type"], name
        # Only the UI's own file types: not the Python module beside them, not directories.
        # A trailing '/' must not serve the file before it either (StaticFiles would).
        for path in (
            "/dgxmm/__init__.py",
            "/dgxmm/__pycache__/",
            "/dgxmm/nope.html",
            "/dgxmm/deployments",
            "/dgxmm/__init__.py/",
            "/dgxmm/app.js/",
            "/dgxmm/index.html/",
            "/dgxmm/parts/detail.html",
            "/dgxmm/parts/",
        ):
            resp = await anon.get(path)
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", path
        # The files need no token; the API still does, and keeps its error shape.
        resp = await anon.get("/dgxmm/api/host")
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
        resp = await anon.get("/dgxmm/api/nope")  # the token comes first, even for unknown paths
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
        resp = await anon.post("/dgxmm/index.html")
        assert resp.status_code == 405
    assert (await svc.client.get("/api/host")).status_code == 200
    resp = await svc.client.get("/api/nope")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert (await svc.client.get("/api/openapi.json")).status_code == 200


async def test_gateway_still_goes_first(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    port = svc.settings.server.port
    # From 127.0.0.1 (not an allowed caller) the peer guard answers 404 before any routing.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as anon:
        resp = await anon.get("/dgxmm/ondemand/x/v1/models")
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
        assert "content-security-policy" not in resp.headers


@pytest.mark.parametrize("base", ["/llm/admin", ""])
async def test_other_base_paths(serve, tmp_path: Path, base: str) -> None:
    # At the root the admin API takes /api, which Ollama's API takes while it is enabled.
    svc = await serve(make_settings(tmp_path, server={"base_path": base}, ollama={"enabled": bool(base)}))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.settings.server.port}") as anon:
        page = await anon.get(f"{base}/")
        assert page.status_code == 200 and "<title>dgxmm</title>" in page.text
        assert (await anon.get(f"{base}/app.js")).status_code == 200
        if base:
            resp = await anon.get(base)
            assert resp.status_code in (307, 308) and resp.headers["location"].endswith(f"{base}/")
    assert (await svc.client.get("/api/deployments")).json() == []


def test_pages_use_relative_urls_only() -> None:
    """Every URL in the UI is relative, so it works under any base path and behind a proxy."""
    html = "".join(path.read_text() for path in (WEB / "index.html", *sorted((WEB / "parts").glob("*.html"))))
    for url in re.findall(r'(?:src|href)="([^"]*)"', html):
        assert not url.startswith(("/", "http:", "https:")), url
    for js in WEB.glob("*.js"):
        text = js.read_text()
        assert not re.search(r"""fetch\(\s*["'`]/""", text), js.name
        if js.name != "prefs.js":  # view preferences only; the token is kept in sessionStorage
            assert "localStorage" not in text, f"{js.name}: the token is kept in sessionStorage only"
        assert "innerHTML" not in text, f"{js.name}: text is set with textContent only"


def test_preferences_never_hold_the_token() -> None:
    """prefs.js stores only the keys of its defaults (layout, filters, sort) and imports nothing,
    so the token cannot reach localStorage through it."""
    text = (WEB / "prefs.js").read_text()
    assert "token" not in text.split("const DEFAULTS", 1)[1].split(";", 1)[0]
    assert "import " not in text and "sessionStorage." not in text


def test_files_stay_small() -> None:
    for path in [*WEB.iterdir(), *(WEB / "parts").iterdir()]:
        if path.is_file():
            assert len(path.read_text().splitlines()) < 500, path.name


def test_the_page_is_its_parts_each_once() -> None:
    """Every part file has its line in index.html, once; the page served has no part line left and
    holds each part's text where its line was (and a part line naming no file fails the build)."""
    page = assemble(WEB).decode()
    skeleton = (WEB / "index.html").read_text()
    for path in sorted((WEB / "parts").glob("*.html")):
        assert skeleton.count(f"<!-- part: {path.stem} -->") == 1, path.name
        assert page.count(path.read_text().rstrip("\n")) == 1, path.name
    assert "<!-- part:" not in page
    assert page.index('id="login-view"') < page.index("</main>") < page.index('id="deploy-dialog"')


def test_a_missing_part_stops_the_build(tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    (tmp_path / "index.html").write_text("<body>\n  <!-- part: here -->\n  <!-- part: gone -->\n</body>\n")
    (tmp_path / "parts" / "here.html").write_text("<p>here</p>\n")
    with pytest.raises(FileNotFoundError):
        assemble(tmp_path)
    (tmp_path / "parts" / "gone.html").write_text("<p>gone</p>\n")
    assert assemble(tmp_path) == b"<body>\n<p>here</p>\n<p>gone</p>\n</body>\n"
