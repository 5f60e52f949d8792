"""The named errors of an on-demand request, each with its HTTP status and OpenAI-style code."""

from __future__ import annotations


class OndemandError(Exception):
    status = 503
    code = "ondemand_error"
    retry_after: int | None = None
    close = False  # the answer closes the connection (what the client still sends is not read)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class QueueFull(OndemandError):
    code = "ondemand_queue_full"
    retry_after = 60


class DoesNotFit(OndemandError):
    code = "does_not_fit"


class StartFailed(OndemandError):
    code = "start_failed"


class Stopped(OndemandError):
    """The deployment was stopped or removed while it was starting for the request."""

    code = "ondemand_stopped"


class Cancelled(OndemandError):
    """An administrator cancelled the request while it waited (``POST /api/waiting/{id}/cancel``)."""

    code = "ondemand_cancelled"


class QueueTimeout(OndemandError):
    code = "ondemand_queue_timeout"


class NoSuchDeployment(OndemandError):
    """No such deployment, or it was removed while the request waited (404)."""

    status = 404
    code = "not_found"


class NotOnDemand(OndemandError):
    code = "not_on_demand"


class ShuttingDown(OndemandError):
    """dgxmm received SIGTERM: waiting requests are answered at once, nothing new starts."""

    code = "shutting_down"
