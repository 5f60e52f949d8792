"""A caller key's requests in flight end when the key no longer allows them (issue 47, finding
9): revoked, narrowed, expired, or ended by an administrator. Through real sockets; the test
engine streams one event at once and the next only after ``SLOW_S``, so any event after the
first that is not the gateway's error would be the engine's: an end that came from the
revocation, not from the answer's own end. The answers that must run on (another model's,
another key's) stream at their own quicker pace, to their end."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from conftest import engine_command, gateway_settings, one_slot_taken, wait_until
from integration.test_caller_keys import CHAT, code_of, new_key, router

SLOW_S = "60"  # seconds between the engine's events
OWN_PACE_S = "0.5"  # the pace of an answer that is left to run to its end
ENDED_BOUND_S = 10  # only bounds a hang: an ended stream's error comes at once


async def slow_model(svc: Any, name: str, delay: str = SLOW_S) -> dict[str, Any]:
    """A ready always-on test engine called ``name`` that streams one event each ``delay`` seconds."""
    view = await svc.create(name=name, engine="command", memory_gib=1, command=engine_command("--chunk-delay", delay))
    return await svc.wait_state(view["id"], "ready")


async def idle(view: dict[str, Any], svc: Any) -> bool:
    """Whether the engine runs no request now (one whose connection closed ends at once)."""
    async with httpx.AsyncClient(headers=svc.engine_auth(view["id"])) as engine:
        return int((await engine.get(view["base_url"] + "/_test/seats")).json()["running"]) == 0


class Stream:
    """A streamed chat answer under way: its first event read, the rest to read."""

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp
        self.lines = resp.aiter_lines()

    async def rest(self) -> list[Any]:
        """The data of every event left, the error events' and ``[DONE]`` among them."""

        async def read() -> list[Any]:
            return [
                line[5:].strip() if line[5:].strip() == "[DONE]" else json.loads(line[5:])
                async for line in self.lines
                if line.startswith("data:")
            ]

        return await asyncio.wait_for(read(), ENDED_BOUND_S)


@asynccontextmanager
async def streaming(client: httpx.AsyncClient, model: str) -> AsyncIterator[Stream]:
    async with client.stream("POST", "/chat/completions", json={**CHAT, "model": model, "stream": True}) as resp:
        assert resp.status_code == 200
        stream = Stream(resp)
        async for line in stream.lines:
            if line.startswith("data:"):
                break  # the first event: the request is in flight at the engine now
        yield stream


def ended_with(events: list[Any], code: str) -> None:
    """The stream ended with the gateway's error event (OpenAI's shape) and ``[DONE]``, and
    nothing of the engine's came after its first event."""
    assert len(events) == 2 and events[1] == "[DONE]", events
    error = events[0]["error"]
    assert error["code"] == code and set(error) >= {"message", "type", "code"}, error


async def test_revoking_a_key_ends_its_stream_at_once_and_the_engines_request(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await slow_model(svc, "a-1")
    made = await new_key(svc, name="alice")
    async with router(svc, made["key"]) as r, streaming(r, "a-1") as stream:
        revoked = await svc.client.delete(f"/api/keys/{made['id']}")
        assert revoked.status_code == 204
        ended_with(await stream.rest(), "key_revoked")
        refused = await r.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert refused.status_code == 401 and code_of(refused) == "invalid_api_key"
    await wait_until(lambda: idle(view, svc), ENDED_BOUND_S)  # the engine's request was cancelled too


async def test_narrowing_a_keys_models_ends_the_streams_of_those_models_only(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    b = await slow_model(svc, "b-1")
    await slow_model(svc, "a-1", OWN_PACE_S)
    made = await new_key(svc, name="alice", models=["a-*", "b-*"])
    async with router(svc, made["key"]) as r, streaming(r, "a-1") as on_a, streaming(r, "b-1") as on_b:
        changed = await svc.client.patch(f"/api/keys/{made['id']}", json={"models": ["a-*"]})
        assert changed.status_code == 200 and changed.json()["persisted"] is True
        ended_with(await on_b.rest(), "model_not_allowed")
        await wait_until(lambda: idle(b, svc), ENDED_BOUND_S)
        rest = await on_a.rest()
        assert rest[-1] == "[DONE]" and not any("error" in event for event in rest[:-1]), rest
        assert rest[-2]["choices"][0]["finish_reason"] == "stop", "a-1's answer ran to its end"


async def test_end_requests_ends_the_keys_requests_streamed_or_not_and_no_other_keys(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await slow_model(svc, "a-1")
    await slow_model(svc, "b-1", OWN_PACE_S)
    made, other = await new_key(svc, name="alice"), await new_key(svc, name="bob")
    async with router(svc, made["key"]) as r, router(svc, other["key"], "127.0.0.3") as o:
        async with streaming(r, "a-1") as mine, streaming(o, "b-1") as bobs:
            whole = asyncio.create_task(r.post("/chat/completions", json={**CHAT, "model": "a-1"}))

            async def both_in_flight() -> bool:
                return (await svc.client.get(f"/api/keys/{made['id']}")).json()["in_flight"] == 2

            await wait_until(both_in_flight, ENDED_BOUND_S)
            ended = await svc.client.post(f"/api/keys/{made['id']}/end-requests")
            assert ended.status_code == 200 and ended.json() == {"id": made["id"], "ended": 2}
            ended_with(await mine.rest(), "request_ended")
            answer = await asyncio.wait_for(whole, ENDED_BOUND_S)
            assert answer.status_code == 503 and code_of(answer) == "request_ended"
            rest = await bobs.rest()
            assert rest[-1] == "[DONE]" and rest[-2]["choices"][0]["finish_reason"] == "stop", "bob's ran on"
        again = await r.post("/chat/completions", json={**CHAT, "model": "b-1"})
        assert again.status_code == 200, "the key itself stays"
    audit = [row for row in svc.ctx.store.list_audit(100) if row["action"] == "key_requests_ended"]
    assert len(audit) == 1 and "alice" in audit[0]["text"] and made["key"] not in repr(audit)
    assert (await svc.client.post("/api/keys/key-000000000000/end-requests")).status_code == 404
    viewer = (await svc.client.post("/api/tokens", json={"name": "dash", "role": "viewer"})).json()["token"]
    seen = await svc.client.post(f"/api/keys/{made['id']}/end-requests", headers={"Authorization": f"Bearer {viewer}"})
    assert seen.status_code == 403


async def test_an_open_stream_ends_at_its_keys_expiry(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await slow_model(svc, "a-1")
    made = await new_key(svc, name="brief")
    async with router(svc, made["key"]) as r, streaming(r, "a-1") as stream:
        soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat()
        assert (await svc.client.patch(f"/api/keys/{made['id']}", json={"expires_at": soon})).status_code == 200
        ended_with(await stream.rest(), "key_expired")


async def test_a_request_waiting_for_its_turn_is_ended_too_and_leaves_the_waiting_list(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    _, slot = await one_slot_taken(svc)
    made = await new_key(svc, name="alice")
    async with router(svc, made["key"]) as r:
        waiting = asyncio.create_task(r.post("/chat/completions", json={**CHAT, "model": "m"}))
        await wait_until(lambda: svc.ctx.ondemand.waiting(), ENDED_BOUND_S)
        ended = await svc.client.post(f"/api/keys/{made['id']}/end-requests")
        assert ended.json()["ended"] == 1
        answer = await asyncio.wait_for(waiting, ENDED_BOUND_S)
        assert answer.status_code == 503 and code_of(answer) == "request_ended"
    assert svc.ctx.ondemand.waiting() == []
    slot.release()


async def _changed_while_the_body_comes(svc: Any, secret: str, change: Any) -> bytes:
    """The status line of a request whose key ``change`` changes after the key was checked and
    before its body is all in."""
    body = json.dumps({**CHAT, "model": "a-1"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", svc.settings.server.port, local_addr=("127.0.0.2", 0))
    try:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body[:10])
        await writer.drain()
        gateway = svc.ctx.entrance.guard.inner
        await wait_until(lambda: gateway.bodies.held > 0, ENDED_BOUND_S)  # its key checked: reading its body
        await change()
        writer.write(body[10:])
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), ENDED_BOUND_S)
    finally:
        writer.close()


async def test_a_key_revoked_while_its_request_body_comes_is_refused_once_the_body_is_in(serve, tmp_path: Path) -> None:
    """The key is checked before the body is read: a revocation during the read is checked again
    before the request is admitted, or it would run with the revoked key."""
    svc = await serve(gateway_settings(tmp_path))
    await slow_model(svc, "a-1", OWN_PACE_S)
    made = await new_key(svc, name="alice")

    async def revoke() -> None:
        assert (await svc.client.delete(f"/api/keys/{made['id']}")).status_code == 204

    status = await _changed_while_the_body_comes(svc, made["key"], revoke)
    assert status.startswith(b"HTTP/1.1 401"), status


async def test_a_key_changed_while_its_request_body_comes_is_checked_as_it_is_now(serve, tmp_path: Path) -> None:
    """A change is a new record of the key (frozen, gateway/keyrecord.py), and the request whose
    body came meanwhile had checked the old one: its model is checked against the key as it is
    once the body is in. A key widened to the model is admitted; one narrowed away is refused."""
    svc = await serve(gateway_settings(tmp_path))
    await slow_model(svc, "a-1", OWN_PACE_S)
    made = await new_key(svc, name="alice", models=["b-*"])

    def patch(body: dict[str, Any]) -> Any:
        async def change() -> None:
            assert (await svc.client.patch(f"/api/keys/{made['id']}", json=body)).status_code == 200

        return change

    status = await _changed_while_the_body_comes(svc, made["key"], patch({"models": ["a-*"]}))
    assert status.startswith(b"HTTP/1.1 200"), status
    status = await _changed_while_the_body_comes(svc, made["key"], patch({"models": ["b-*"]}))
    assert status.startswith(b"HTTP/1.1 404"), status
