"""How a request ended under way is answered (gateway/refusal.py ``ended``): its error while no
answer began, its error event inside an event stream stopped between two events, else a cut;
and a caller that reads nothing more cannot hold it past ``ENDED_WRITE_S``."""

from __future__ import annotations

import asyncio
import json

import pytest
from unit.recorded import Recorded

from dgxmm.gateway.refused import Refused
from dgxmm.gateway import refusal
from dgxmm.gateway.exchange import Exchange

REVOKED = Refused(401, "key_revoked", "the key alice was revoked")


def exchange() -> Exchange:
    return Exchange(0.0, "r-1", "127.0.0.2")


async def test_before_any_answer_the_reason_is_the_answer() -> None:
    req, ex = Recorded(), exchange()
    await refusal.ended(req, ex, REVOKED)
    assert req.status == 401 and json.loads(req.body_bytes)["error"]["code"] == "key_revoked"
    assert ex.code == "key_revoked" and req.cuts == 0


async def test_inside_an_event_stream_between_events_it_is_an_error_event_then_done() -> None:
    req, ex = Recorded(), exchange()
    await req.start(200, [])
    await req.write(b'data: {"choices": []}\n\n')
    ex.between_events = True
    await refusal.ended(req, ex, REVOKED)
    tail = req.body_bytes.split(b"\n\n")
    assert json.loads(tail[1][5:])["error"]["code"] == "key_revoked" and tail[2] == b"data: [DONE]"
    assert req.ended and req.cuts == 0 and req.status == 200


async def test_any_other_answer_under_way_is_cut() -> None:
    req, ex = Recorded(), exchange()
    await req.start(200, [(b"content-length", b"100")])
    await refusal.ended(req, ex, REVOKED)
    assert req.cuts == 1 and not req.ended and ex.code == "key_revoked"


class Stalled(Recorded):
    """A caller that reads nothing more: the last write never completes."""

    async def end(self, last: bytes = b"") -> None:
        await asyncio.Event().wait()


async def test_a_caller_that_reads_nothing_more_is_cut_after_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refusal, "ENDED_WRITE_S", 0.05)
    req, ex = Stalled(), exchange()
    await req.start(200, [])
    ex.between_events = True
    await asyncio.wait_for(refusal.ended(req, ex, REVOKED), 10)
    assert req.cuts == 1
