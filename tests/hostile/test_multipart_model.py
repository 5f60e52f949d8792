"""Issue 47 finding 8, replayed: a multipart form that names two models. The router read the
first ``model`` field while Starlette (vLLM's audio routes) reads the last, so a key limited to
one model could route by one name and have the engine read another. Now the router reads the
last, as it does of a JSON body, and the engine sees the name it serves. Through real sockets,
test engines as real processes."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import engine_command, gateway_settings

pytestmark = pytest.mark.hostile

AUDIO = bytes(range(256)) * 16


def two_names(first: str, last: str) -> tuple[bytes, str]:
    """A transcription form with ``model`` twice: ``first`` before the file, ``last`` after it."""
    request = httpx.Request(
        "POST", "http://x/", data={"model": first, "language": "en"}, files={"file": ("a.wav", AUDIO, "audio/wav")}
    )
    body, ctype = request.read(), request.headers["content-type"]
    boundary = ctype.split("boundary=")[1].encode()
    end = body.rindex(b"--" + boundary + b"--")
    field = b'--%s\r\nContent-Disposition: form-data; name="model"\r\n\r\n%s\r\n' % (boundary, last.encode())
    return body[:end] + field + body[end:], ctype


async def forms_heard(view: dict[str, Any]) -> list[bytes]:
    async with httpx.AsyncClient() as c:
        heard = (await c.get(view["base_url"] + "/_test/requests")).json()
    return [base64.b64decode(r["body_b64"]) for r in heard if r["path"] == "/v1/audio/transcriptions"]


async def test_a_form_naming_two_models_is_routed_by_the_last(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    views = {
        name: await svc.create(
            name=name,
            engine="command",
            memory_gib=1,
            mode="on_demand",
            aliases=[f"{name}-alias"],
            command=engine_command(),
        )
        for name in ("open", "secret")
    }
    made = await svc.client.post("/api/keys", json={"name": "narrow", "models": ["open", "open-alias"]})
    assert made.status_code == 201, made.text
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {made.json()['key']}"},
        timeout=30,
    ) as r:
        body, ctype = two_names("open", "secret")  # allowed first, the other model last
        smuggled = await r.post("/audio/transcriptions", content=body, headers={"content-type": ctype})
        body, ctype = two_names("secret", "open-alias")  # the last is the key's: served, as the engine reads it
        served = await r.post("/audio/transcriptions", content=body, headers={"content-type": ctype})
    assert smuggled.status_code == 404 and smuggled.json()["error"]["code"] == "model_not_found", smuggled.text
    assert served.status_code == 200, served.text
    assert (await svc.view(views["secret"]["id"]))["state"] == "stopped"  # never started, never reached
    [heard] = await forms_heard(await svc.view(views["open"]["id"]))
    assert heard.rstrip().endswith(b"--") and b'name="model"\r\n\r\nopen\r\n' in heard  # its served name, last
    assert heard.index(b'name="model"\r\n\r\nsecret\r\n') < heard.index(AUDIO)  # the first as it came
