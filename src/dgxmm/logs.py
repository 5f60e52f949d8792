"""Log lines as text or as JSON (``[server] log_format``), and the access log.

Every line carries time, level, logger and message. Lines about one deployment or one gateway
request also carry, when known, ``deployment`` (its id), ``served_name``, ``request_id`` and
``peer``: callers pass them as ``extra=`` (see ``fields``) rather than through context variables,
because tasks copy their context when they are created, and a start or a watchdog spawned while
serving a request would then carry that request's id for the rest of its life.

Uvicorn's own access log is switched off (``cli.serve``): it writes the query string. The access
lines written here have the method, the path without its query and the status; never a header.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

FIELDS = ("deployment", "served_name", "request_id", "peer")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_PATH = 512

access = logging.getLogger("dgxmm.access")

# Control characters (and DEL) of a logged path are written escaped, so a crafted path cannot
# start a fake log line in the text format.
_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F)}


def fields(
    deployment: str | None = None,
    served_name: str | None = None,
    request_id: str | None = None,
    peer: str | None = None,
) -> dict[str, str]:
    """The ``extra`` of a log call: the fields that are known."""
    given = {"deployment": deployment, "served_name": served_name, "request_id": request_id, "peer": peer}
    return {key: value for key, value in given.items() if value}


def printable(text: str, limit: int = MAX_PATH) -> str:
    """``text`` with control characters escaped, cut at ``limit`` characters."""
    text = text.translate(_ESCAPES)
    return text if len(text) <= limit else text[:limit] + "..."


class TextFormatter(logging.Formatter):
    """The classic one-line format, with the known fields appended as ``[key=value ...]``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        known = [f"{key}={value}" for key in FIELDS if (value := getattr(record, key, None))]
        if not known:
            return line
        head, sep, tail = line.partition("\n")  # a traceback stays below the first line
        return f"{head} [{' '.join(known)}]{sep}{tail}"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the known fields,
    and ``exception`` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _iso(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def configure(level: str, log_format: str) -> None:
    """One handler on the root logger, writing to stderr in ``log_format``; dgxmm's loggers and
    Uvicorn's (started with ``log_config=None``) all reach it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
