"""The queued notice (dgxmm.gateway.notice).

Spec (Gateway, "Queued notice"): streaming chat/completions and completions get one chunk with
id "ondemand-queued" and the notice as content; non-streaming answers get it prepended to
choices[0].message.content (a string), choices[0].text, or the first output_text part of the
first message item of a Responses answer, every other byte unchanged; other endpoints are never
modified; a request that asks for structured output gets no notice.
"""

from __future__ import annotations

import json

import pytest

from dgxmm.gateway.notice import NOTICE, prepend, stream_chunk, wants_structured_output

ESCAPED = json.dumps(NOTICE)[1:-1].encode()


def assert_only_notice_added(out: bytes, raw: bytes) -> None:
    assert out != raw
    assert out.count(ESCAPED) == raw.count(ESCAPED) + 1
    assert out.replace(ESCAPED, b"") == raw


# --- wants_structured_output --------------------------------------------------------------------

FIELDS = [
    "response_format",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
]
VALUES = {
    "response_format": {"type": "json_object"},
    "tools": [{"type": "function"}],
    "tool_choice": "auto",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "structured_outputs": {"json": {}},
    "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+",
    "guided_choice": ["a", "b"],
    "guided_grammar": "root ::= x",
    "guided_decoding_backend": "xgrammar",
}


@pytest.mark.parametrize("field", FIELDS)
def test_structured_field_set_wants_structured_output(field):
    assert wants_structured_output({"model": "m", "messages": [], field: VALUES[field]}) is True


@pytest.mark.parametrize("field", FIELDS)
def test_structured_field_null_does_not(field):
    assert wants_structured_output({"model": "m", "messages": [], field: None}) is False


@pytest.mark.parametrize("value", [False, 0, "", [], {}])
def test_structured_field_set_to_falsy_value_still_counts(value):
    assert wants_structured_output({"tools": value}) is True
    assert wants_structured_output({"guided_json": value}) is True


def test_plain_chat_request_does_not_want_structured_output():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "temperature": 0.2,
        "max_tokens": 10,
    }
    assert wants_structured_output(body) is False


def test_responses_text_format_json_schema_wants_structured_output():
    body = {"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}
    assert wants_structured_output(body) is True


def test_responses_text_format_json_object_wants_structured_output():
    assert wants_structured_output({"input": "hi", "text": {"format": {"type": "json_object"}}}) is True


def test_responses_text_format_text_does_not():
    assert wants_structured_output({"input": "hi", "text": {"format": {"type": "text"}}}) is False


@pytest.mark.parametrize("text", [None, {}, {"format": None}, {"verbosity": "low"}])
def test_responses_text_format_missing_does_not(text):
    body = {"input": "hi"} if text is None else {"input": "hi", "text": text}
    assert wants_structured_output(body) is False


@pytest.mark.parametrize("body", [None, [], ["tools"], "tools", 42, b"{}", [{"tools": []}]])
def test_non_dict_body_does_not_want_structured_output(body):
    assert wants_structured_output(body) is False


# --- stream_chunk -------------------------------------------------------------------------------


def parse_chunk(chunk: bytes) -> dict:
    assert chunk.startswith(b"data: ")
    assert chunk.endswith(b"\n\n")
    assert chunk.count(b"\n") == 2  # a single data line
    return json.loads(chunk[len(b"data: ") : -2])


def test_chat_stream_chunk_is_a_chat_completion_chunk():
    data = parse_chunk(stream_chunk("chat/completions", "qwen3-8b"))
    assert data["object"] == "chat.completion.chunk"
    assert data["id"] == "ondemand-queued"
    assert data["model"] == "qwen3-8b"
    assert isinstance(data["created"], int)
    [choice] = data["choices"]
    assert choice["index"] == 0
    assert choice["delta"]["content"] == NOTICE
    assert choice["delta"]["role"] == "assistant"
    assert choice["finish_reason"] is None


def test_completions_stream_chunk_is_a_text_completion():
    data = parse_chunk(stream_chunk("completions", "qwen3-8b"))
    assert data["object"] == "text_completion"
    assert data["id"] == "ondemand-queued"
    assert data["model"] == "qwen3-8b"
    [choice] = data["choices"]
    assert choice["index"] == 0
    assert choice["text"] == NOTICE
    assert choice["finish_reason"] is None


def test_stream_chunk_model_name_is_json_escaped():
    data = parse_chunk(stream_chunk("chat/completions", 'we"ird\nmodel é'))
    assert data["model"] == 'we"ird\nmodel é'


# --- prepend: chat/completions ------------------------------------------------------------------


def chat_answer(content: str | None = "Hello!") -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


def test_chat_content_gets_notice_prepended():
    out = prepend("chat/completions", chat_answer("Hello!"))
    assert json.loads(out)["choices"][0]["message"]["content"] == NOTICE + "Hello!"


def test_chat_other_bytes_unchanged():
    raw = chat_answer("Hello!")
    assert_only_notice_added(prepend("chat/completions", raw), raw)


def test_chat_empty_content_gets_notice():
    out = prepend("chat/completions", chat_answer(""))
    assert json.loads(out)["choices"][0]["message"]["content"] == NOTICE


def test_chat_unusual_whitespace_preserved():
    raw = (
        b'\r\n\t {  "id" :"x" ,\n\n "choices"\t:\r\n [ \n { "index" : 0 ,"message"  :\t{ "role":'
        b'"assistant" ,  "content"  :   "Hi there"  } , "finish_reason":"stop" }\n ]\t,"usage":{} }\n '
    )
    out = prepend("chat/completions", raw)
    assert_only_notice_added(out, raw)
    assert json.loads(out)["choices"][0]["message"]["content"] == NOTICE + "Hi there"


def test_chat_content_before_role_preserved():
    raw = b'{"choices":[{"message":{"content":"First","role":"assistant"},"index":0}]}'
    out = prepend("chat/completions", raw)
    assert_only_notice_added(out, raw)
    assert json.loads(out)["choices"][0]["message"]["content"] == NOTICE + "First"


def test_chat_unicode_escapes_and_non_ascii_preserved():
    raw = (
        '{"model":"\\u00e9t\\u00e9 m\\u00f6del","choices":[{"message":{"role":"assistant",'
        '"reasoning_content":"d\\u00e9j\\u00e0 \\"vu\\" \\ud83d\\ude00","content":"Gr\\u00fc\\u00dfe, '
        'ça va? 😀 日本語 \\n\\"q\\""}}],"note":"naïve"}'
    ).encode()
    out = prepend("chat/completions", raw)
    assert_only_notice_added(out, raw)
    assert json.loads(out)["choices"][0]["message"]["content"] == NOTICE + 'Grüße, ça va? 😀 日本語 \n"q"'


def test_chat_nested_objects_before_choices_preserved():
    raw = (
        b'{"id":"x","meta":{"choices":[{"message":{"content":"decoy"}}],"a":[1,[2,{"b":"}]"}]],'
        b'"s":"{\\"choices\\":[]"},"prompt_logprobs":null,"n":-1.5e3,"t":true,'
        b'"choices":[{"message":{"role":"assistant","content":"real"}}]}'
    )
    out = prepend("chat/completions", raw)
    assert_only_notice_added(out, raw)
    data = json.loads(out)
    assert data["choices"][0]["message"]["content"] == NOTICE + "real"
    assert data["meta"]["choices"][0]["message"]["content"] == "decoy"


def test_chat_choices_not_first_preserved():
    raw = (
        b'{"usage":{"prompt_tokens":3},"object":"chat.completion","created":17,'
        b'"choices":[{"finish_reason":"stop","logprobs":{"content":[{"token":"a"}]},'
        b'"message":{"tool_calls":[],"role":"assistant","content":"text"},"index":0}],"model":"m"}'
    )
    out = prepend("chat/completions", raw)
    assert_only_notice_added(out, raw)
    assert json.loads(out)["choices"][0]["message"]["content"] == NOTICE + "text"


def test_chat_only_first_choice_gets_notice():
    raw = b'{"choices":[{"message":{"content":"one"}},{"message":{"content":"two"}}]}'
    data = json.loads(prepend("chat/completions", raw))
    assert data["choices"][0]["message"]["content"] == NOTICE + "one"
    assert data["choices"][1]["message"]["content"] == "two"


def test_chat_tool_call_answer_with_null_content_unchanged():
    raw = json.dumps(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    },
                    "finish_reason": "tool_calls",
                }
            ]
        }
    ).encode()
    assert prepend("chat/completions", raw) == raw


def test_chat_missing_content_unchanged():
    raw = b'{"choices":[{"message":{"role":"assistant"}}]}'
    assert prepend("chat/completions", raw) == raw


def test_chat_non_string_content_unchanged():
    raw = b'{"choices":[{"message":{"role":"assistant","content":[{"type":"text","text":"hi"}]}}]}'
    assert prepend("chat/completions", raw) == raw


@pytest.mark.parametrize("raw", [b'{"choices":[]}', b'{"choices":{}}', b'{"choices":null}', b'{"id":"x"}', b"{}"])
def test_chat_without_first_choice_unchanged(raw):
    assert prepend("chat/completions", raw) == raw


# --- prepend: completions -----------------------------------------------------------------------


def test_completions_text_gets_notice_prepended():
    raw = json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": "m",
            "choices": [{"index": 0, "text": " world", "logprobs": None, "finish_reason": "length"}],
            "usage": {"total_tokens": 3},
        }
    ).encode()
    out = prepend("completions", raw)
    assert_only_notice_added(out, raw)
    assert json.loads(out)["choices"][0]["text"] == NOTICE + " world"


def test_completions_without_text_unchanged():
    raw = b'{"choices":[{"index":0,"finish_reason":"length"}]}'
    assert prepend("completions", raw) == raw


# --- prepend: responses -------------------------------------------------------------------------


def test_responses_first_output_text_of_first_message_gets_notice():
    raw = json.dumps(
        {
            "id": "resp-1",
            "object": "response",
            "status": "completed",
            "output": [
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "think"}],
                },
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "Answer", "annotations": []},
                        {"type": "output_text", "text": "More", "annotations": []},
                    ],
                },
                {
                    "type": "message",
                    "id": "msg_2",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Second", "annotations": []}],
                },
            ],
        }
    ).encode()
    out = prepend("responses", raw)
    assert_only_notice_added(out, raw)
    data = json.loads(out)
    assert data["output"][0]["content"][0]["text"] == "think"
    assert data["output"][1]["content"][0]["text"] == NOTICE + "Answer"
    assert data["output"][1]["content"][1]["text"] == "More"
    assert data["output"][2]["content"][0]["text"] == "Second"


def test_responses_output_text_after_other_part_types():
    raw = (
        b'{"output":[{"type":"message","content":[{"type":"refusal","refusal":"no"},'
        b'{"text":"Yes","type":"output_text"}]}]}'
    )
    out = prepend("responses", raw)
    assert_only_notice_added(out, raw)
    assert json.loads(out)["output"][0]["content"][1]["text"] == NOTICE + "Yes"


def test_responses_without_output_text_in_first_message_unchanged():
    raw = (
        b'{"output":[{"type":"reasoning","content":[{"type":"output_text","text":"x"}]},'
        b'{"type":"message","content":[{"type":"refusal","refusal":"no"}]},'
        b'{"type":"message","content":[{"type":"output_text","text":"later"}]}]}'
    )
    assert prepend("responses", raw) == raw


@pytest.mark.parametrize(
    "raw",
    [
        b'{"output":[]}',
        b'{"id":"r"}',
        b'{"output":null}',
        b'{"output":[{"type":"function_call","name":"f","arguments":"{}"}]}',
        b'{"output":[{"type":"reasoning","summary":[]}]}',
    ],
)
def test_responses_without_message_unchanged(raw):
    assert prepend("responses", raw) == raw


# --- prepend: unchanged cases -------------------------------------------------------------------


def test_embeddings_unchanged():
    raw = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"m"}'
    assert prepend("embeddings", raw) == raw


@pytest.mark.parametrize("endpoint", ["messages", "rerank", "score", "audio/transcriptions", "chat/completions/batch"])
def test_other_endpoints_unchanged(endpoint):
    raw = b'{"choices":[{"message":{"content":"x"},"text":"y"}],"text":"z","content":[{"type":"text","text":"t"}]}'
    assert prepend(endpoint, raw) == raw


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions", "responses"])
@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"<html>502</html>", b"{", b'{"choices":', b'{"choices":[{', b"\xff\xfe{}", b'{"choices" 1}'],
)
def test_invalid_json_unchanged(endpoint, raw):
    assert prepend(endpoint, raw) == raw


@pytest.mark.parametrize(
    "raw",
    [
        b'{"choices":[{"message":{"content":"hi"}}]',  # the closing brace is missing
        b'{"choices":[{"message":{"content":"hi"}}]}}',  # one brace too many
        b'{"choices":[{"message":{"content":"hi"}}]} trailing',
    ],
    ids=["truncated", "extra-brace", "trailing-garbage"],
)
def test_chat_invalid_json_with_valid_prefix_unchanged(raw):
    assert prepend("chat/completions", raw) == raw


@pytest.mark.parametrize("raw", [b"[]", b"null", b"[1,2]", b"42", b'"just a string"'])
def test_responses_non_object_json_unchanged(raw):
    assert prepend("responses", raw) == raw


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions", "responses"])
def test_error_body_unchanged(endpoint):
    raw = b'{"error":{"message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}}'
    assert prepend(endpoint, raw) == raw
    raw2 = b'{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}'
    assert prepend(endpoint, raw2) == raw2
