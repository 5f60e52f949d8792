"""A request body read whole, with a limit: never more than the limit is buffered.

The admin API's guard and the gateway both need the body before they act (the guard replays it
to the app after the token check; the gateway checks and forwards it), and both must refuse a
body past their limit before holding it. One reader, so the limit is enforced the same way.
"""

from __future__ import annotations

from starlette.types import Receive


class ClientGone(Exception):
    """The caller hung up before its body was read: there is nobody to answer."""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes ``limit`` bytes; ClientGone on a disconnect."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
