"""dgxmm's own log, its latest lines kept in memory for the console (``GET /api/log``).

An operator asking why a caller was refused, or what the gateway did with a request id, reads
these lines where they read everything else, without a shell on the host. The handler sits on
the root logger beside the one writing to stderr, so it keeps exactly what is written there (at
``[server] log_level``), as records, not formatted text: the console filters them by level,
request id or words. Lines are kept, not their arguments: the message is formatted once, and a
traceback is kept as text.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from dgxmm.logs import FIELDS

KEEP = 2000  # lines kept; an operator looks at the last minutes, the file or journal has the rest
MAX_MESSAGE = 8192  # a longer message (a traceback) is cut: the console shows lines, not dumps
LEVELS = ("debug", "info", "warning", "error", "critical")


class RecentLines(logging.Handler):
    """The last ``keep`` log records as plain dicts, newest last. Logging calls it from any
    thread (the handler's lock guards the ring); readers copy under the same lock."""

    def __init__(self, keep: int = KEEP) -> None:
        super().__init__()
        self._lines: deque[dict[str, Any]] = deque(maxlen=keep)
        self._formatter = logging.Formatter()  # only for a record's traceback text

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message = f"{message}\n{self._formatter.formatException(record.exc_info)}"
            line: dict[str, Any] = {
                "time": record.created,
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "...",
            }
            for key in FIELDS:
                value = getattr(record, key, None)
                if value:
                    line[key] = value
        except Exception:  # noqa: BLE001 - logging's rule: a handler never raises
            self.handleError(record)
            return
        self._lines.append(line)  # (emit runs under the handler's lock: Handler.handle)

    def query(self, limit: int, level: str | None = None, text: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` lines, newest first: at ``level`` or above, containing ``text``
        (case-insensitive, in the message, the logger or a field such as the request id)."""
        self.acquire()
        try:
            lines = list(self._lines)
        finally:
            self.release()
        floor = LEVELS.index(level) if level in LEVELS else 0
        needle = text.lower() if text else None
        found = []
        for line in reversed(lines):
            rank = LEVELS.index(line["level"]) if line["level"] in LEVELS else len(LEVELS)
            if rank < floor:
                continue
            if needle is not None and not any(needle in str(value).lower() for key, value in line.items()
                                              if key not in ("time", "level")):  # fmt: skip
                continue
            found.append(line)
            if len(found) >= limit:
                break
        return found
