"""The engine's usage read from answers of any size and from streams cut anywhere, and the
usage-only chunk dgxmm asked for held out of a stream wherever its chunks are cut (issue 47)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgxmm.gateway.usagescan import CAP, UsageReader
from dgxmm.gateway.usageonly import MAX_HELD, UsageOnly

CONTENT = b'data: {"choices":[{"index":0,"delta":{"content":"say \\"usage\\": {}"}}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE_ONLY = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":6,"completion_tokens":5,"total_tokens":11}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = CONTENT + FINISH + USAGE_ONLY + DONE


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def passed(chunks: list[bytes]) -> bytes:
    held = UsageOnly()
    return b"".join(held.pass_on(chunk) for chunk in chunks) + held.end()


@given(cuts=st.lists(st.integers(1, len(STREAM) - 1), max_size=8, unique=True))
def test_the_usage_only_chunk_is_held_out_wherever_the_stream_is_cut(cuts: list[int]) -> None:
    assert passed(cut(STREAM, cuts)) == CONTENT + FINISH + DONE
    reader = UsageReader(stream=True)
    for chunk in cut(STREAM, cuts):
        reader.feed(chunk)
    reader.end()
    assert (reader.prompt_tokens, reader.completion_tokens) == (6, 5)


def test_every_other_event_passes_as_it_came() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    assert passed([crlf]) == (CONTENT + FINISH + DONE).replace(b"\n", b"\r\n")
    # llama-server's older final chunk: usage beside its choice, which the client must get
    llama = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1}}\n\n'
    assert passed([llama, DONE]) == llama + DONE
    typed = b'event: response.completed\ndata: {"choices":[],"usage":null}\n\n'  # no usage object
    assert passed([typed]) == typed
    assert passed([b"data: {not json\n\n", b'data: {"choices":[],"usage":{}}']) == b"data: {not json\n\n" + (
        b'data: {"choices":[],"usage":{}}'  # cut short by the stream's end: passed as it came
    )


def test_an_event_too_long_to_hold_passes_as_it_comes() -> None:
    held = UsageOnly()
    head = b'data: {"choices":[{"delta":{"content":"' + b"x" * (MAX_HELD + 10)
    assert held.pass_on(head) == head  # passed at once, not held
    assert held.pass_on(b'more"}}]}\n\n' + USAGE_ONLY[:20]) == b'more"}}]}\n\n'
    assert held.pass_on(USAGE_ONLY[20:] + DONE) == DONE
    assert held.end() == b""


def big_answer(content_mib: int, usage_first: bool = False) -> bytes:
    usage = {"prompt_tokens": 12, "completion_tokens": 345678, "total_tokens": 345690}
    choices = [{"index": 0, "message": {"content": "usage: " + "x" * (content_mib << 20)}}]
    body = {"usage": usage, "choices": choices} if usage_first else {"choices": choices, "usage": usage}
    return json.dumps({"id": "c", **body, "prompt_logprobs": None}).encode()


@pytest.mark.parametrize("usage_first", [False, True])
@pytest.mark.parametrize("piece", [1 << 16, 1000, 7])
def test_an_answer_of_any_size_is_read_for_its_usage(usage_first: bool, piece: int) -> None:
    body = big_answer(6 if piece > 1000 else 1, usage_first)
    reader = UsageReader(stream=False)
    for at in range(0, len(body), piece):
        reader.feed(body[at : at + piece])
    reader.end()
    assert (reader.prompt_tokens, reader.completion_tokens) == (12, 345678)


def test_a_stream_lines_past_a_mib_and_nested_usage() -> None:
    completed = {
        "type": "response.completed",
        "response": {"output": [{"text": "y" * (2 << 20)}], "usage": {"input_tokens": 4, "output_tokens": 9}},
    }
    reader = UsageReader(stream=True)
    created = b'event: response.created\ndata: {"response":{"usage":null}}\n\n'
    reader.whole(created + b"event: response.completed\ndata: " + json.dumps(completed).encode() + b"\n\n")
    assert (reader.prompt_tokens, reader.completion_tokens) == (4, 9)
    anthropic = UsageReader(stream=True)
    anthropic.feed(b'event: message_start\ndata: {"message":{"usage":{"input_tokens":7,"output_tokens":1}}}\n\n')
    anthropic.feed(b'event: message_delta\ndata: {"delta":{},"usage":{"output_tokens":30}}\n\n')
    anthropic.end()
    assert (anthropic.prompt_tokens, anthropic.completion_tokens) == (7, 30)


def test_an_object_past_the_cap_is_no_usage() -> None:
    reader = UsageReader(stream=False)
    reader.whole(b'{"usage":{"pad":"' + b"p" * CAP + b'","prompt_tokens":1}}')
    assert not reader.reported
