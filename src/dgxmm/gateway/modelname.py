"""Which model a request names, for the model router: the JSON body's ``model``, or the ``model``
field of a multipart form (the audio routes); and the body with another name in its place.

A deployment called by an alias gets the request with its served name instead: an engine that
checks the name (vLLM answers 404 to any other) must see the one it serves. Only that one value
changes, in place, every other byte as it came: a form's field; a JSON body's last top-level
``model`` value (the one Python's json, orjson and llama.cpp's nlohmann keep of a repeated key),
replaced by the served name as a JSON string. Nothing is parsed or written again, so numbers,
escapes, lone surrogates and invalid UTF-8 elsewhere reach the engine untouched.

Forms are read with python-multipart (the parser Starlette uses), as the body is fed to it in
pieces; nothing of a file part is kept. A form with two ``model`` fields names the last, as its
JSON twin does: Starlette's ``request.form()`` (vLLM's audio routes) keeps the last of a repeated
field, so the router's choice and the engine's never differ. The whole form is read for that, in a
worker thread past ``jsonbody.FAST_BYTES`` (``scans``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dgxmm.front.body import Body
from dgxmm.gateway.jsonbody import Facts, model_span
from dgxmm.gateway.toplevel import Shape
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

if TYPE_CHECKING:  # python-multipart declares its callbacks' shape for type checkers only
    from python_multipart.multipart import MultipartCallbacks

PIECE = 64 * 1024  # bytes of a form fed to the parser at a time
MAX_NAME_BYTES = 1024  # a longer ``model`` field is no model's name


class NoModel(Exception):
    """The request names no model (a 400 for the caller, with ``code``)."""

    def __init__(self, message: str, code: str = "missing_model") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Named:
    """The name a request gives; for a form, where it lies in the body's bytes (None when the
    parser gave it in pieces that are not one run of the body: then it stays as it is)."""

    name: str
    form: bool = False
    span: tuple[int, int] | None = None


def named(body: Body, facts: Facts, content_type: str | None) -> Named:
    """The model ``body`` names: a form's field when it is ``multipart/form-data``, else the
    JSON body's (``facts``, the gateway read them already). Raises ``NoModel``."""
    kind, options = parse_options_header(content_type or "")
    if kind == b"multipart/form-data":
        boundary = options.get(b"boundary")
        if not boundary:
            raise NoModel("a multipart/form-data body without a boundary")
        return _in_form(body, boundary)
    if facts.shape is Shape.NOT_JSON and body:
        raise NoModel("the body is not JSON (nor a multipart form)", "invalid_json")
    if facts.shape is not Shape.OBJECT:
        raise NoModel("the body is not a JSON object naming a model")
    name = facts.model
    if not name:
        raise NoModel('the body names no model: give its name as "model"')
    return Named(name)


def renamed(body: Body, where: Named, name: str, facts: Facts | None = None) -> Body:
    """``body`` with ``name`` in place of the name ``where`` found (a JSON body's ``facts`` say
    where its model lies). One copy is made: the two runs around the name, joined."""
    if where.form:
        if where.span is None:
            return body
        start, end = where.span
        value = name.encode()
    else:
        span = model_span(body, facts) if facts is not None else None
        if span is None:
            return body
        start, end = span
        value = json.dumps(name).encode()  # ASCII: a served name of any text is valid here
    view = memoryview(body)
    return b"".join((view[:start], value, view[end:]))


def _in_form(body: Body, boundary: bytes) -> Named:
    """The ``model`` field of a form: its text and its place in ``body``."""
    found = _FormField(b"model")
    parser = MultipartParser(boundary, found.callbacks())
    try:
        for start in range(0, len(body), PIECE):
            found.offset = start
            parser.write(bytes(body[start : start + PIECE]))  # (a piece of 64 KiB: copied)
    except MultipartParseError as exc:
        raise NoModel("the multipart form cannot be read") from exc
    if not found.done:
        raise NoModel('the form names no model: give its name in a field "model"')
    if len(found.value) > MAX_NAME_BYTES:
        raise NoModel(f"the form's model field is longer than {MAX_NAME_BYTES} bytes")
    try:
        text = found.value.decode()
    except UnicodeDecodeError:
        raise NoModel("the form's model field is not UTF-8 text") from None
    if not text:
        raise NoModel("the form's model field is empty")
    span = found.span if found.span is not None and body[found.span[0] : found.span[1]] == found.value else None
    return Named(text, True, span)


class _FormField:
    """python-multipart callbacks that note where one field's value lies in the whole body (its
    last part's, when the form repeats the field)."""

    def __init__(self, field: bytes) -> None:
        self.field = field
        self.offset = 0  # where the piece being parsed begins in the body
        self.done = False
        self.value = b""  # the field's value (at most a name's length is kept)
        self.span: tuple[int, int] | None = None
        self._header = b""
        self._value = b""
        self._headers: dict[bytes, bytes] = {}
        self._ours = False
        self._broken = False

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._data,
            "on_part_end": self._end,
        }

    def _begin(self) -> None:
        self._headers, self._header, self._value, self._ours = {}, b"", b"", False

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header.lower()] = self._value
        self._header, self._value = b"", b""

    def _headers_finished(self) -> None:
        kind, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._ours = kind == b"form-data" and options.get(b"name") == self.field
        if self._ours:  # a later part of the same name wins: what was found of an earlier one goes
            self.done, self.value, self.span, self._broken = False, b"", None, False

    def _data(self, data: bytes, start: int, end: int) -> None:
        if not self._ours:
            return
        if len(self.value) <= MAX_NAME_BYTES:
            self.value += data[start:end][: MAX_NAME_BYTES + 1 - len(self.value)]
        begin, finish = self.offset + start, self.offset + end  # checked against the body at the end
        if self.span is None and not self._broken:
            self.span = (begin, finish)
        elif self.span is not None and self.span[1] == begin:
            self.span = (self.span[0], finish)
        else:
            self.span, self._broken = None, True

    def _end(self) -> None:
        if self._ours:
            self._ours = False
            self.done = True
