"""``HEAD`` wherever ``GET`` is: the admin API's and the metrics' routes answer a ``HEAD`` with
the headers their ``GET`` would send, and no body (RFC 9110 section 9.3.2; docs/api.md lets a
viewer token ``HEAD``, and monitors probe with it).

FastAPI routes a ``HEAD`` to no ``GET`` route (Starlette's own ``Route`` would), so without this
layer a ``HEAD`` fell through to the web UI's mount and was 404. The request is handed to the
app as a ``GET``; the answer's head goes out as it is (its ``Content-Length`` included), then an
empty end, and the rest of the app's body is dropped. An endless answer (an event stream) is told
the client left as soon as its head is out, so nothing keeps running for a ``HEAD``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DISCONNECT: Message = {"type": "http.disconnect"}


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        answered = False

        async def head_only(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def until_answered() -> Message:
            return DISCONNECT if answered else await receive()

        await self.app({**scope, "method": "GET"}, until_answered, head_only)
