"""The Ollama API's translation (dgxmm/ollama/translate.py, answers.py): Ollama's requests as the
engine's OpenAI requests, each bad input a 400 before any engine sees it, and the engine's
answers (whole and streamed) as Ollama's, with counts from the engine's usage."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgxmm.gateway.notice import NOTICE, stream_chunk
from dgxmm.ollama import translate
from dgxmm.ollama.answers import StreamTranslator, Times, chat_answer, embed_answer, error_text, loaded_answer
from dgxmm.ollama.translate import BadInput

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode()
TIMES = Times(arrival=10.0, loaded=12.0, engine_byte=12.5, end=13.0)


def chat(**body: Any) -> translate.Translated:
    return translate.chat({"model": "qwen3", **body})


def test_a_chat_maps_messages_options_format_think_and_tools() -> None:
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    done = chat(
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is this", "images": [PNG]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
            },
            {"role": "tool", "content": "sunny", "tool_name": "weather"},
        ],
        options={
            "temperature": 0.2,
            "top_k": 40,
            "num_predict": 64,
            "stop": ["\n\n"],
            "repeat_penalty": 1.1,
            "seed": 7,
        },
        format={"type": "object"},
        think=True,
        tools=tools,
        keep_alive="5m",
    )
    assert (done.endpoint, done.stream, done.model, done.keep_alive_s) == ("chat/completions", True, "qwen3", 300.0)
    body = done.body
    assert body is not None
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    ]
    call = body["messages"][2]["tool_calls"][0]
    assert call["type"] == "function" and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert body["messages"][3] == {"role": "tool", "content": "sunny", "tool_call_id": call["id"]}
    assert body["temperature"] == 0.2 and body["top_k"] == 40 and body["max_tokens"] == 64 and body["seed"] == 7
    assert body["stop"] == ["\n\n"] and body["repetition_penalty"] == body["repeat_penalty"] == 1.1
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "format", "schema": {"type": "object"}},
    }
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["tools"] == tools
    assert body["stream_options"] == {"include_usage": True}
    assert "keep_alive" not in body and "options" not in body and "num_ctx" not in json.dumps(body)


def test_stream_false_json_format_and_the_special_num_predicts() -> None:
    done = chat(messages=[{"role": "user", "content": "hi"}], stream=False, format="json", options={"num_predict": -1})
    assert done.stream is False and done.body is not None
    assert "stream" not in done.body and "max_tokens" not in done.body
    assert done.body["response_format"] == {"type": "json_object"}
    assert "max_tokens" not in (
        chat(messages=[{"role": "user", "content": "x"}], options={"num_predict": -2}).body or {}
    )


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "options": {"temperature": "hot"}}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "options": {"top_k": 1.5}}, "top_k"),
        ({"messages": [{"role": "user", "content": "x"}], "options": {"seed": True}}, "seed"),
        ({"messages": [{"role": "user", "content": "x"}], "options": {"num_predict": -3}}, "num_predict"),
        ({"messages": [{"role": "user", "content": "x"}], "options": "fast"}, "options"),
        ({"messages": [{"role": "user", "content": "x", "images": ["not base64!"]}]}, "base64"),
        ({"messages": [{"role": "user", "content": "x"}] * 10_000}, "10000 messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "format": "yaml"}, "format"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "keep_alive": "soon"}, "keep_alive"),
        ({"messages": [{"role": "user", "content": "x"}], "think": "max"}, "think"),
    ],
)
def test_bad_chat_input_is_refused_with_a_message_that_names_it(body: dict[str, Any], says: str) -> None:
    with pytest.raises(BadInput) as caught:
        chat(**body)
    assert caught.value.status == 400 and says in caught.value.message


def test_num_ctx_past_the_engine_context_is_refused_and_never_forwarded() -> None:
    message = {"messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(BadInput, match="larger than the model's context"):
        translate.chat({"model": "m", **message, "options": {"num_ctx": 8192}}, context=4096)
    done = translate.chat({"model": "m", **message, "options": {"num_ctx": 2048}}, context=4096)
    assert done.body is not None and "num_ctx" not in json.dumps(done.body)


def test_not_json_and_no_model() -> None:
    with pytest.raises(BadInput, match="not JSON"):
        translate.parse(b"{nope")
    with pytest.raises(BadInput, match="object"):
        translate.parse(b"[1]")
    with pytest.raises(BadInput, match="model is required"):
        translate.chat({"messages": []})


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (None, None),
        (0, 0.0),
        ("0", 0.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        (30, 30.0),
        ("-1", float("inf")),
        (-1, float("inf")),
    ],
)
def test_keep_alive_durations(given: Any, seconds: float | None) -> None:
    assert translate.keep_alive_s(given) == seconds


def test_generate_is_a_chat_or_with_raw_a_completion_and_an_empty_prompt_only_loads() -> None:
    done = translate.generate({"model": "m", "prompt": "hi", "system": "terse", "options": {"min_p": 0.1}})
    assert done.endpoint == "chat/completions" and done.body is not None
    assert done.body["messages"] == [{"role": "system", "content": "terse"}, {"role": "user", "content": "hi"}]
    assert done.body["min_p"] == 0.1
    raw = translate.generate({"model": "m", "prompt": "[INST] hi", "raw": True, "stream": False})
    assert raw.endpoint == "completions" and raw.body == {"model": "m", "prompt": "[INST] hi"}
    load = translate.generate({"model": "m", "prompt": "", "keep_alive": 0})
    assert load.body is None and load.keep_alive_s == 0
    assert translate.chat({"model": "m", "messages": []}).body is None
    with pytest.raises(BadInput) as caught:
        translate.generate({"model": "m", "prompt": "a", "suffix": "b"})
    assert caught.value.status == 501


def test_embed_takes_a_string_or_strings_and_the_older_route_a_prompt() -> None:
    assert translate.embed({"model": "e", "input": "a"}).body == {"model": "e", "input": ["a"]}
    assert translate.embed({"model": "e", "input": ["a", "b"], "dimensions": 8}).body == {
        "model": "e",
        "input": ["a", "b"],
        "dimensions": 8,
    }
    assert translate.embed({"model": "e", "prompt": "a"}, legacy=True).body == {"model": "e", "input": ["a"]}
    with pytest.raises(BadInput):
        translate.embed({"model": "e", "input": [1, 2]})


def test_a_whole_chat_answer_has_the_engines_counts_and_the_cold_start_as_load_duration() -> None:
    answer = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": NOTICE + "Hi",
                    "reasoning_content": "hm",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5},
    }
    out = chat_answer(answer, "chat", "qwen3:latest", TIMES)
    assert out["message"] == {
        "role": "assistant",
        "content": "Hi",
        "thinking": "hm",
        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
    }
    assert out["model"] == "qwen3:latest" and out["done"] is True and out["done_reason"] == "stop"
    assert (out["prompt_eval_count"], out["eval_count"]) == (11, 5)
    assert out["total_duration"] == 3_000_000_000 and out["load_duration"] == 2_000_000_000
    assert out["prompt_eval_duration"] == 500_000_000 and out["eval_duration"] == 500_000_000
    timed = chat_answer({**answer, "timings": {"prompt_ms": 12.5, "predicted_ms": 40}}, "generate", "m", TIMES)
    assert timed["prompt_eval_duration"] == 12_500_000 and timed["eval_duration"] == 40_000_000
    assert timed["response"] == "Hi" and timed["thinking"] == "hm"


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def delta(**fields: Any) -> dict[str, Any]:
    return {"id": "x", "choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_a_stream_becomes_ndjson_lines_whatever_the_chunk_boundaries() -> None:
    events = sse(
        delta(role="assistant", content=""),
        delta(content="Hel"),
        delta(reasoning_content="think"),
        delta(content="lo"),
        delta(tool_calls=[{"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"x"'}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": ": 2}"}}]),
        {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    )
    whole = StreamTranslator("chat", "m")
    at_once = whole.feed(events) + whole.final(TIMES)
    piecewise = StreamTranslator("chat", "m")
    lines = b"".join(piecewise.feed(events[i : i + 7]) for i in range(0, len(events), 7)) + piecewise.final(TIMES)
    for got in (at_once, lines):
        objs = [json.loads(line) for line in got.splitlines()]
        assert [o["message"].get("content") for o in objs[:3]] == ["Hel", "", "lo"]
        assert objs[1]["message"]["thinking"] == "think"
        assert objs[3]["message"]["tool_calls"] == [{"function": {"name": "f", "arguments": {"x": 2}}}]
        assert [o["done"] for o in objs] == [False] * 4 + [True]
        final = objs[-1]
        assert final["done_reason"] == "length" and (final["prompt_eval_count"], final["eval_count"]) == (3, 4)
        assert {"created_at", "total_duration", "load_duration", "eval_duration"} <= set(final)


def test_the_queued_notice_is_dropped_and_an_error_event_ends_the_stream() -> None:
    stream = StreamTranslator("generate", "m")
    out = stream.feed(
        stream_chunk("chat/completions", "m") + b"data: " + json.dumps(delta(content="a")).encode() + b"\n\n"
    )
    out += stream.feed(b'data: {"error": {"message": "the engine broke off", "code": "x"}}\n\ndata: [DONE]\n\n')
    out += stream.final(TIMES)
    objs = [json.loads(line) for line in out.splitlines()]
    assert objs == [objs[0], {"error": "the engine broke off"}] and objs[0]["response"] == "a"


def test_errors_embeddings_and_loads() -> None:
    assert error_text(b'{"error": {"message": "no", "type": "t", "code": "c"}}') == "no"
    assert error_text(b'{"error": "plain"}') == "plain"
    assert error_text(b'{"detail": "vllm says"}') == "vllm says"
    assert error_text(b"<html>") == "<html>"
    answer = {
        "data": [{"index": 1, "embedding": [0.2]}, {"index": 0, "embedding": [0.1]}],
        "usage": {"prompt_tokens": 2},
    }
    assert embed_answer(answer, "e", TIMES, legacy=False)["embeddings"] == [[0.1], [0.2]]
    assert embed_answer(answer, "e", TIMES, legacy=False)["prompt_eval_count"] == 2
    assert embed_answer(answer, "e", TIMES, legacy=True) == {"embedding": [0.1]}
    assert loaded_answer("generate", "m", "unload")["done_reason"] == "unload"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "system",
        "images",
        "options",
        "format",
        "think",
        "tools",
        "stream",
        "raw",
        "keep_alive",
        "suffix",
        "input",
        "dimensions",
        "role",
        "content",
        "tool_calls",
        "function",
        "arguments",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(FIELDS, JSON_VALUES, max_size=8))
def test_any_json_object_is_translated_or_refused_never_an_error_of_another_kind(body: dict[str, Any]) -> None:
    """Whatever a caller sends, the answer is a translation or a 400 (never a 500)."""
    for translated in (translate.chat, translate.generate, translate.embed):
        try:
            translated(body)
        except BadInput:
            pass
    for messages in ([body], [{"role": "user", **body}], [{"role": "assistant", "tool_calls": [body]}]):
        try:
            translate.chat({"model": "m", "messages": messages, "options": body})
        except BadInput:
            pass


ANSWER_FIELDS = st.sampled_from(
    [
        "choices",
        "message",
        "delta",
        "content",
        "text",
        "tool_calls",
        "function",
        "arguments",
        "usage",
        "prompt_tokens",
        "completion_tokens",
        "timings",
        "finish_reason",
        "error",
        "data",
        "embedding",
        "index",
        "id",
    ]
)
ANSWERS = st.recursive(
    st.dictionaries(ANSWER_FIELDS, JSON_VALUES, max_size=6),
    lambda inner: st.dictionaries(ANSWER_FIELDS, inner | st.lists(inner, max_size=3), max_size=6),
    max_leaves=25,
)


@settings(max_examples=150, deadline=None)
@given(ANSWERS)
def test_any_engine_answer_is_translated_without_an_error(answer: dict[str, Any]) -> None:
    """An engine that answers an odd shape gets its caller an odd answer, never a server error."""
    for kind in ("chat", "generate"):
        chat_answer(answer, kind, "m", TIMES)
        stream = StreamTranslator(kind, "m")
        stream.feed(b"data: " + json.dumps(answer).encode() + b"\n\n")
        stream.final(TIMES)
    for legacy in (False, True):
        embed_answer(answer, "m", TIMES, legacy)
