"""The model a request names (issue 27): a JSON body's ``model`` or a multipart form's field, and
the body with the served name in place of an alias: only that value changes."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgxmm.gateway.jsonbody import NOT_JSON, read
from dgxmm.gateway.modelname import NoModel, named, renamed

NAME = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40)


def form(fields: list[tuple[str, str]], file: bytes, file_first: bool) -> tuple[bytes, str]:
    """A multipart body as the OpenAI SDK's HTTP client writes one, the file before or after."""
    request = httpx.Request("POST", "http://x/", data=dict(fields), files={"file": ("a.wav", file, "audio/wav")})
    body, ctype = request.read(), request.headers["content-type"]
    if file_first:  # httpx writes the fields first: move the file part to the front
        boundary = ctype.split("boundary=")[1].encode()
        parts = body.split(b"--" + boundary)
        body = b"--" + boundary + (b"--" + boundary).join([parts[-2], *parts[1:-2], parts[-1]])
    return body, ctype


@settings(max_examples=150, deadline=None)
@given(name=NAME, served=NAME, file=st.binary(max_size=3000), pieces=st.integers(0, 3), file_first=st.booleans())
def test_a_forms_model_is_found_and_replaced_in_place(
    name: str, served: str, file: bytes, pieces: int, file_first: bool
) -> None:
    noise = b"\r\n--" * pieces  # what a boundary begins with, inside the file
    body, ctype = form([("model", name), ("language", "en")], noise + file + noise, file_first)
    found = named(body, NOT_JSON, ctype)
    assert found.name == name and found.form
    assert found.span is not None
    start, end = found.span
    assert body[:start].endswith(b'name="model"\r\n\r\n') and body[start:end] == name.encode()
    again = renamed(body, found, served)
    assert again == body[:start] + served.encode() + body[end:]  # that value, nothing else
    assert named(again, NOT_JSON, ctype).name == served and noise + file + noise in again


@pytest.mark.parametrize(
    "rest",
    [
        b'"n": 123456789012345678901234567890, "x": 1.25e15, "y": 1e999, "z": NaN, "s": "\\u00e9"',
        b'"s": "\\ud83d", "bad": "\xff\xfe", "deep": [[[{"model": "nested"}]]]',  # reach the engine untouched
    ],
)
def test_a_json_body_keeps_every_byte_but_the_model(rest: bytes) -> None:
    body = b'{"stream": true, "model": "old", ' + rest + b', "model" :\t"alias" }'
    facts = read(body)
    found = named(body, facts, "application/json")
    assert found.name == "alias" and not found.form
    again = renamed(body, found, 'served "é"', facts)
    assert again == body.replace(b'"alias"', b'"served \\"\\u00e9\\""')  # the last model, as the engine reads it
    assert read(again).model == 'served "é"'


@pytest.mark.parametrize(
    ("body", "ctype", "code"),
    [
        (b"", "application/json", "missing_model"),
        (b"{oops", "application/json", "invalid_json"),
        (b"[1]", "application/json", "missing_model"),
        (b'{"model": 3}', None, "missing_model"),
        (b'{"model": ""}', None, "missing_model"),
        (b'{"model": "\\x"}', None, "missing_model"),  # no valid string
        (b"x", "multipart/form-data", "missing_model"),
        (b"--b\r\ngarbage", "multipart/form-data; boundary=zz", "missing_model"),
    ],
)
def test_a_body_naming_no_model_is_refused_with_its_code(body: bytes, ctype: str | None, code: str) -> None:
    with pytest.raises(NoModel) as refused:
        named(body, read(body), ctype)
    assert refused.value.code == code


def test_a_form_without_a_model_field_or_with_an_overlong_one_names_none() -> None:
    body, ctype = form([("language", "en")], b"RIFF", False)
    with pytest.raises(NoModel, match="names no model"):
        named(body, NOT_JSON, ctype)
    body, ctype = form([("model", "m" * 2000)], b"RIFF", False)
    with pytest.raises(NoModel, match="longer than"):
        named(body, NOT_JSON, ctype)


async def starlettes_model(body: bytes, ctype: str) -> str:
    """The ``model`` Starlette's own form parser gives an engine (vLLM's audio routes read it so)."""
    from starlette.requests import Request

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    request = Request({"type": "http", "method": "POST", "headers": [(b"content-type", ctype.encode())]}, receive)
    async with request.form() as fields:
        return str(fields["model"])


@settings(max_examples=60, deadline=None)
@given(first=NAME, last=NAME, served=NAME, file=st.binary(max_size=2000), file_first=st.booleans())
async def test_a_form_naming_two_models_names_the_last_as_the_engine_reads_it(
    first: str, last: str, served: str, file: bytes, file_first: bool
) -> None:
    """Issue 47 item 6: the router routes by the field the engine will read (Starlette keeps the
    last of a repeated field), and renames that one: the first can smuggle nothing past a key."""
    body, ctype = form([("model", first), ("language", "en")], file, file_first)
    boundary = ctype.split("boundary=")[1].encode()
    second = b"--" + boundary + b'\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + last.encode() + b"\r\n"
    body = body[: body.rindex(b"--" + boundary + b"--")] + second + b"--" + boundary + b"--\r\n"
    found = named(body, NOT_JSON, ctype)
    assert found.name == last == await starlettes_model(body, ctype)
    assert found.span is not None and found.span[0] > body.rindex(second)  # the last field's value
    again = renamed(body, found, served)
    assert await starlettes_model(again, ctype) == served
    assert again[: found.span[0]] == body[: found.span[0]]  # the first field stays as it came
