"""dgxmm's own log, its latest lines kept in memory for the console (``GET /api/log``).

An operator asking why a caller was refused, or what the gateway did with a request id, reads
these lines where they read everything else, without a shell on the host. The handler sits on
the root logger beside the one writing to stderr, so it keeps exactly what is written there (at
``[server] log_level``), as records, not formatted text: the console filters them by level,
request id or words. Lines are kept, not their arguments: the message is formatted once, and a
traceback is kept as text. Warnings and errors are kept apart from the rest, longer: the access
lines of a busy minute must not push out the warning an operator came to read.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from typing import Any

from dgxmm.logs import FIELDS

KEEP = 2000  # lines below warning kept; an operator looks at the last minutes, the file or journal has the rest
KEEP_WARNINGS = 10_000  # warnings and errors, kept apart: access lines never push them out
MAX_MESSAGE = 8192  # a longer message (a traceback) is cut: the console shows lines, not dumps
LEVELS = ("debug", "info", "warning", "error", "critical")
_WARNING = LEVELS.index("warning")


class RecentLines(logging.Handler):
    """The last ``keep`` log records below warning (access lines, mostly) and, apart, the last
    ``keep_warnings`` warnings and errors, as plain dicts, newest last: a burst of requests
    cannot push a warning out of the console. Logging calls it from any thread (the handler's
    lock guards the rings); readers copy under the same lock."""

    def __init__(self, keep: int = KEEP, keep_warnings: int = KEEP_WARNINGS) -> None:
        super().__init__()
        # Each line with its number in the order it was logged, to read the two rings as one.
        self._lines: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)
        self._warnings: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep_warnings)
        self._count = itertools.count()
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
        ring = self._warnings if record.levelno >= logging.WARNING else self._lines
        ring.append((next(self._count), line))  # (emit runs under the handler's lock: Handler.handle)

    def query(self, limit: int, level: str | None = None, text: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` lines, newest first: at ``level`` or above, containing ``text``
        (case-insensitive, in the message, the logger or a field such as the request id)."""
        floor = LEVELS.index(level) if level in LEVELS else 0
        self.acquire()
        try:
            warnings = list(self._warnings)
            lines = list(self._lines) if floor < _WARNING else []
        finally:
            self.release()
        needle = text.lower() if text else None
        found = []
        newest_first = heapq.merge(reversed(lines), reversed(warnings), key=lambda numbered: numbered[0], reverse=True)
        for _, line in newest_first:
            rank = LEVELS.index(line["level"]) if line["level"] in LEVELS else len(LEVELS)
            if rank < floor:
                continue
            if needle is not None and not any(
                needle in str(value).lower() for key, value in line.items() if key not in ("time", "level")
            ):
                continue
            found.append(line)
            if len(found) >= limit:
                break
        return found
