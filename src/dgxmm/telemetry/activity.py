"""The activity log: one record per gateway request (per-deployment routes and the model router
alike), what an operator looks for first when a caller says "my request at 10:42 took 40 s":
whether it queued, cold-started or generated slowly, and what it cost in tokens.

``Activity`` is the one owner: the last ``[activity] keep`` records in memory (newest last), read
by ``GET /api/activity`` with filters, each new one published on the event bus (``event:
activity``) for the console; with ``[activity] file`` also appended as a JSON line to
``<data_dir>/activity.jsonl``, rotated by the standard library's ``RotatingFileHandler`` at
``file_max_bytes`` with ``file_count`` old files kept. A line the disk refuses is dropped and
counted, never raised into the gateway. The file and its backups are 0600 like every file dgxmm
writes: a record names the caller's address, the model and when it was used.
"""

from __future__ import annotations

import heapq
import io
import json
import logging
import logging.handlers
import os
import statistics
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dgxmm.datadir import FILE_MODE, open_private
from dgxmm.gateway.exchange import GONE, HEALTH_CHECK, Exchange
from dgxmm.telemetry.metrics import Load

SPEED_WINDOW = 20  # answers a deployment's recent speed is the median of

# How a request ended, from what the gateway noted (the order of the checks is the answer's).
OUTCOMES = (
    "answered",
    "engine_error",
    "hang_up",
    "queue_timeout",
    "queue_full",
    "start_failed",
    "does_not_fit",
    "upstream_error",
    "refused",
    "health_check",
)
_BY_CODE = {
    "ondemand_queue_timeout": "queue_timeout",
    "ondemand_queue_full": "queue_full",
    "start_failed": "start_failed",
    "does_not_fit": "does_not_fit",
    "ondemand_upstream_error": "upstream_error",
}


def outcome_of(ex: Exchange) -> str:
    """How the request ended: answered by the engine (or its error passed on), the caller gone,
    one of the on-demand failures, or refused by dgxmm's checks."""
    if ex.route == HEALTH_CHECK:
        return "health_check"
    if ex.code is not None:
        return _BY_CODE.get(ex.code, "refused")
    if ex.status == GONE:
        return "hang_up"
    return "answered" if ex.status < 400 else "engine_error"


def record_of(ex: Exchange, now: float, wall: float, load: Load | None = None) -> dict[str, Any]:
    """The activity record of a request that ended at ``now`` (monotonic; ``wall`` is the same
    moment in Unix time). ``ttfb_s`` is the first byte the caller got (dgxmm's queued notice
    counts), ``ttft_s`` the engine's first body byte (its first token): apart when the request
    queued with a notice. Token counts are the engine's ``usage``, null when it gave none;
    ``tokens_per_s`` is ``Exchange.tokens_per_s``. ``model`` is the name a caller gave the model
    router (null on a deployment's own routes), kept when no deployment has it. ``load`` is the
    engine load it waited for (``Metrics.load_waited_for``): ``load_s`` and ``cached_fraction``."""
    usage = ex.usage
    prompt = usage.prompt_tokens if usage is not None else None
    completion = usage.completion_tokens if usage is not None else None
    speed = ex.tokens_per_s(now)
    return {
        "time": round(wall - (now - ex.arrival), 3),
        "request_id": ex.request_id,
        "deployment_id": ex.deployment_id,
        "served_name": ex.served_name,
        "model": ex.model,
        "route": ex.route,
        "api": ex.api,  # the API it came in by: "openai" (/v1, the per-deployment routes) or "ollama" (/api)
        "status": ex.status,
        "stream": bool(usage is not None and usage.stream),
        "queued_s": round(ex.slot_at - ex.arrival, 3) if ex.slot_at else 0.0,
        "cold_start": ex.cold,
        "load_s": round(load.seconds, 3) if load is not None else None,
        "cached_fraction": load.cached_fraction if load is not None else None,
        "ttfb_s": round(ex.first_byte - ex.arrival, 3) if ex.first_byte else None,
        "ttft_s": round(ex.engine_byte - ex.arrival, 3) if ex.engine_byte else None,
        "duration_s": round(now - ex.arrival, 3),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens_per_s": None if speed is None else round(speed, 2),
        "client": ex.peer,
        "key": ex.key,  # the caller key's name, "key-file" for the key file's
        "priority": ex.priority,  # its priority (gateway/reqpriority.py): its key's, or less if it asked
        "outcome": outcome_of(ex),
    }


class Activity:
    def __init__(
        self,
        keep: int,
        path: Path | None = None,
        max_bytes: int = 0,
        backups: int = 0,
        publish: Callable[[dict[str, Any]], None] | None = None,
        log_position: Callable[[str], int | None] | None = None,
    ) -> None:
        self._records: deque[dict[str, Any]] = deque(maxlen=keep)
        self._speeds: dict[str, deque[float]] = {}  # deployment -> its latest answers' speeds
        self.publish = publish  # set by the app: the event bus's ``activity`` events
        # Where the engine's log is when a request ends (the runtime's, one stat of a file): the
        # console shows the engine's lines up to there with the request.
        self._log_position = log_position
        self.dropped_lines = 0  # records the file could not take (a full disk)
        self._file: logging.Logger | None = None
        if path is not None:
            _tighten([path, *(path.with_name(f"{path.name}.{i}") for i in range(1, backups + 1))])
            handler = _Lines(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
            handler.owner = self
            self._file = logging.Logger(f"dgxmm.activity.{id(self)}")  # its own: never the root's handlers
            self._file.propagate = False
            self._file.addHandler(handler)

    def add(self, record: dict[str, Any]) -> None:
        speed, dep_id = record.get("tokens_per_s"), record.get("deployment_id")
        record["engine_log_at"] = self._log_position(dep_id) if self._log_position and dep_id else None
        self._records.append(record)
        if speed is not None and dep_id is not None:
            self._speeds.setdefault(dep_id, deque(maxlen=SPEED_WINDOW)).append(speed)
        if self._file is not None:
            self._file.info(json.dumps(record, separators=(",", ":")))
        if self.publish is not None:
            self.publish(record)

    def tokens_per_s(self, deployment_id: str) -> float | None:
        """The deployment's recent generation speed: the median of its last answers' speeds."""
        speeds = self._speeds.get(deployment_id)
        return round(statistics.median(speeds), 1) if speeds else None

    def forget(self, deployment_id: str) -> None:
        self._speeds.pop(deployment_id, None)

    def query(
        self,
        deployment: str | None = None,
        status: int | None = None,
        since: float | None = None,
        limit: int = 100,
        key: str | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first by arrival (``time``): the records of one deployment (its id or served
        name), of one status, of one key (its name), that arrived from ``since`` (Unix time) on,
        at most ``limit``.

        Records are kept in the order the requests ended, and a long one ends after shorter ones
        that came later; the search walks back from the latest end and stops where a request
        ended before every arrival it must show (it, and everything older, arrived earlier)."""
        if limit <= 0:
            return []
        found: list[dict[str, Any]] = []
        latest: list[float] = []  # the ``limit`` latest arrivals found so far, a min-heap
        for record in reversed(self._records):
            ended = record["time"] + record.get("duration_s", 0.0)
            if since is not None and ended < since:
                break  # ended, so arrived, before ``since``: older from here on
            if len(latest) >= limit and ended < latest[0]:
                break  # arrived before the ``limit`` found, as did every older one
            if since is not None and record["time"] < since:
                continue
            if deployment is not None and deployment not in (record["deployment_id"], record["served_name"]):
                continue
            if status is not None and record["status"] != status:
                continue
            if key is not None and record.get("key") != key:
                continue
            found.append(record)
            if len(latest) < limit:
                heapq.heappush(latest, record["time"])
            else:
                heapq.heappushpop(latest, record["time"])
        found.sort(key=lambda r: r["time"], reverse=True)  # stable: one arrival keeps the later end first
        return found[:limit]

    def close(self) -> None:
        if self._file is not None:
            for handler in self._file.handlers:
                handler.close()


def _tighten(paths: list[Path]) -> None:
    """Make the files an older dgxmm left readable (0644) private, once at start-up."""
    for path in paths:
        try:
            os.chmod(path, FILE_MODE)
        except OSError:
            pass  # not there (or not a file we can reach: its line is dropped and counted then)


class _Lines(logging.handlers.RotatingFileHandler):
    """The file's handler: a line the disk refuses is dropped and counted, not printed. It
    creates the file 0600 (the standard library's ``open`` would make it 0644 under the usual
    umask); a rollover renames the file, so every backup keeps that mode."""

    owner: Activity

    def _open(self) -> io.TextIOWrapper:  # logging's name: how the handler opens the file, and again after a rollover
        fd = open_private(Path(self.baseFilename), os.O_WRONLY | os.O_APPEND)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)

    def handleError(self, record: logging.LogRecord) -> None:  # logging's name
        self.owner.dropped_lines += 1
