"""``Refused``: the gateway's refusal of a request by its own checks (path, key, scope, quota,
rate limit, body, deployment), or its end under way, answered like the on-demand errors it sits
beside: the error envelope with its status and code, its ``Retry-After`` and whether the
connection closes."""

from __future__ import annotations

from dgxmm.controller.errors import OndemandError


class Refused(OndemandError):
    """A refusal by the gateway's own checks (path, key, rate limit, body, deployment)."""

    def __init__(
        self, status: int, code: str, message: str, retry_after: int | None = None, close: bool = False
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.retry_after, self.close = status, code, retry_after, close
