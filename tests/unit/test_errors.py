"""One error envelope for the admin API and the on-demand gateway."""

from __future__ import annotations

import json

import pytest

from dgxmm.api.errors import error_response
from dgxmm.errors import error_body
from dgxmm.gateway.responses import send_error
from unit.recorded import Recorded


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (409, "conflict_error"),
        (413, "invalid_request_error"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (418, "invalid_request_error"),
        (500, "server_error"),
        (502, "server_error"),
        (503, "server_error"),
    ],
)
async def test_api_and_gateway_answer_the_same_envelope(status: int, kind: str) -> None:
    req = Recorded()
    await send_error(req, status, "some_code", "what happened")
    gateway = json.loads(req.body_bytes)
    api = json.loads(error_response(status, "some_code", "what happened").body)
    assert gateway == api == {"error": {"message": "what happened", "type": kind, "code": "some_code"}}


def test_input_errors_name_the_field() -> None:
    assert error_body(422, "invalid_input", "name: taken", "name")["error"]["field"] == "name"
