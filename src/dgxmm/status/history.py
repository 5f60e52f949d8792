"""History for pictures: the last hour of each deployment's traffic, its last cold starts, and
the host's memory by deployment, kept in memory so the UI and scripts can draw them without a
Prometheus (``GET /api/deployments/{id}/history``, ``GET /api/host/history``).

Nothing here decides anything and nothing is persisted: after a dgxmm restart the history starts
empty. ``History`` is the one owner of this state; it is fed through four narrow entry points,
so other consumers (a Prometheus exporter, for instance) can hook in beside it:

* ``request``, ``refused`` and ``answered``: the gateway, for each traffic request, each
  on-demand refusal, and each traffic request's end (its tokens, whether it failed: the model's
  usage today and in the last hour, ``records.tally.Tally``, counted since dgxmm started);
* ``load``: the live-status poll, with each deployment's in-flight and queued counts;
* ``on_change``: a deployer listener, for starts, wakes and their outcomes;
* ``memory``: the live-status poll, with what each deployment holds and what queued ones want.

Times are Unix times (``time.time()``), because they are shown to people and sent to browsers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from dgxmm.records.changes import Change
from dgxmm.records.deployment import State
from dgxmm.records.tally import Tally

MINUTE = 60.0
WINDOW_MINUTES = 60  # one hour of per-minute buckets
MAX_STARTS = 20  # start records kept per deployment
MAX_REASON = 4000  # characters of a failure reason kept with its start record
MAX_HOST_POINTS = 4000  # memory points kept (a point is added only when something changed)


@dataclass
class Minute:
    """One minute of one deployment's traffic. ``*_max`` are the highest counts seen in it;
    ``*_end`` the last, carried into the following minutes until a new observation."""

    start: float
    requests: int = 0
    refusals: int = 0
    inflight_max: int = 0
    queued_max: int = 0
    inflight_end: int = 0
    queued_end: int = 0


@dataclass
class StartRecord:
    """One cold start (``start``) or wake from sleep (``wake``), from entering ``starting`` to
    ready, failed or stopped (``outcome`` is ``loading`` until then)."""

    kind: str
    began_at: float
    ended_at: float | None = None
    duration_s: float | None = None
    outcome: str = "loading"
    reason: str = ""


@dataclass
class Track:
    minutes: deque[Minute] = field(default_factory=lambda: deque(maxlen=WINDOW_MINUTES))
    starts: deque[StartRecord] = field(default_factory=lambda: deque(maxlen=MAX_STARTS))
    last_request_at: float | None = None
    inflight: int = 0
    queued: int = 0
    usage: Tally = field(default_factory=Tally)


@dataclass(frozen=True)
class HostPoint:
    time: float
    usable_gib: float
    held: dict[str, float]  # deployment id -> declared GiB, for each deployment holding memory
    wanted_gib: float  # what deployments in the memory queue need
    placed: dict[str, list[int]] = field(
        default_factory=dict
    )  # id -> the devices it holds memory on (hosts with devices)


class History:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.since = clock()  # what is counted here is counted from this moment
        self._tracks: dict[str, Track] = {}
        self._names: dict[str, str] = {}
        self._host: deque[HostPoint] = deque(maxlen=MAX_HOST_POINTS)

    # --- feeding ------------------------------------------------------------------------------

    def _track(self, deployment_id: str) -> Track:
        track = self._tracks.get(deployment_id)  # not setdefault: a Track is built only when new
        if track is None:
            track = self._tracks[deployment_id] = Track()
        return track

    def _minute(self, track: Track, now: float) -> Minute:
        start = now - now % MINUTE
        if not track.minutes or track.minutes[-1].start < start:
            track.minutes.append(
                Minute(
                    start,
                    inflight_max=track.inflight,
                    queued_max=track.queued,
                    inflight_end=track.inflight,
                    queued_end=track.queued,
                )
            )
        return track.minutes[-1]

    def request(self, deployment_id: str) -> None:
        """A traffic request for the deployment arrived at the gateway."""
        now = self.clock()
        track = self._track(deployment_id)
        self._minute(track, now).requests += 1
        track.last_request_at = now

    def refused(self, deployment_id: str, code: str) -> None:
        """The gateway refused a request for the deployment (queue full or timed out, a start
        that failed or cannot fit, ...)."""
        self._minute(self._track(deployment_id), self.clock()).refusals += 1

    def answered(self, deployment_id: str, prompt_tokens: int, completion_tokens: int, failed: bool) -> None:
        """A traffic request for the deployment ended (answered, refused or failed: ``failed``)
        and cost these tokens."""
        self._track(deployment_id).usage.add(self.clock(), prompt_tokens, completion_tokens, failed)

    def load(self, deployment_id: str, inflight: int, queued: int) -> None:
        """The deployment's current in-flight and queued counts."""
        track = self._track(deployment_id)
        minute = self._minute(track, self.clock())  # a new minute starts with the counts until now
        track.inflight, track.queued = inflight, queued
        minute.inflight_max = max(minute.inflight_max, inflight)
        minute.queued_max = max(minute.queued_max, queued)
        minute.inflight_end, minute.queued_end = inflight, queued

    def on_change(self, change: Change) -> None:
        """Deployer listener: a start or wake begins on entering ``starting`` and ends on the
        next state; a removed deployment's traffic is forgotten (its memory points stay)."""
        dep, now = change.deployment, self.clock()
        self._names[dep.id] = dep.name
        if change.kind == "removed":
            self._tracks.pop(dep.id, None)
            return
        if change.kind != "state" or dep.state == change.old_state:
            return
        starts = self._track(dep.id).starts
        running = starts[-1] if starts and starts[-1].outcome == "loading" else None
        if running is not None and dep.state is not State.STARTING:
            running.ended_at = now
            running.duration_s = round(now - running.began_at, 3)
            running.outcome = {State.READY: "ready", State.FAILED: "failed"}.get(dep.state, "stopped")
            if dep.state is State.FAILED:
                running.reason = dep.state_reason[:MAX_REASON]
        if dep.state is State.STARTING:
            kind = "wake" if change.old_state is State.ASLEEP else "start"
            starts.append(StartRecord(kind, now))

    def memory(
        self,
        usable_gib: float,
        held: dict[str, float],
        wanted_gib: float,
        names: dict[str, str],
        placed: dict[str, list[int]] | None = None,
    ) -> None:
        """The host's memory now (``names`` of the deployments, for the chart's legend;
        ``placed``: on a host with devices, where each holds memory, for a chart per device);
        stored only when it differs from the last point."""
        self._names.update(names)
        where = placed or {}
        last = self._host[-1] if self._host else None
        if last is not None and (last.usable_gib, last.held, last.wanted_gib, last.placed) == (
            usable_gib,
            held,
            wanted_gib,
            where,
        ):
            return
        self._host.append(HostPoint(self.clock(), usable_gib, dict(held), wanted_gib, dict(where)))

    # --- reading ------------------------------------------------------------------------------

    def last_request_at(self, deployment_id: str) -> float | None:
        track = self._tracks.get(deployment_id)
        return track.last_request_at if track else None

    def starts(self, deployment_id: str) -> list[StartRecord]:
        track = self._tracks.get(deployment_id)
        return list(track.starts) if track else []

    def last_cold_start(self, deployment_id: str) -> StartRecord | None:
        """The latest start or wake that ended ready."""
        return next((s for s in reversed(self.starts(deployment_id)) if s.outcome == "ready"), None)

    def deployment(self, deployment_id: str) -> dict[str, Any]:
        """The last hour minute by minute (oldest first, the current minute last, minutes
        without an observation carrying the counts seen before them) and the start records."""
        now = self.clock()
        current = now - now % MINUTE
        track = self._tracks.get(deployment_id) or Track()
        by_start = {m.start: m for m in track.minutes}
        carry = (0, 0)
        earlier = [m for m in track.minutes if m.start <= current - WINDOW_MINUTES * MINUTE]
        if earlier:
            carry = (earlier[-1].inflight_end, earlier[-1].queued_end)
        minutes = []
        for i in range(WINDOW_MINUTES - 1, -1, -1):
            start = current - i * MINUTE
            m = by_start.get(start)
            if m is None:
                minutes.append(
                    {"start": start, "requests": 0, "refusals": 0, "inflight_max": carry[0], "queued_max": carry[1]}
                )
                continue
            carry = (m.inflight_end, m.queued_end)
            minutes.append(
                {
                    "start": start,
                    "requests": m.requests,
                    "refusals": m.refusals,
                    "inflight_max": m.inflight_max,
                    "queued_max": m.queued_max,
                }
            )
        return {
            "deployment_id": deployment_id,
            "minute_s": MINUTE,
            "minutes": minutes,
            "starts": [asdict(s) for s in track.starts],
            "last_request_at": track.last_request_at,
            "usage": self._usage(track, now),
        }

    def usage(self) -> dict[str, dict[str, Any]]:
        """Each deployment's usage (those with a request since dgxmm started), by id."""
        now = self.clock()
        return {dep_id: self._usage(track, now) for dep_id, track in self._tracks.items() if track.usage.day}

    def _usage(self, track: Track, now: float) -> dict[str, Any]:
        return {
            "today": track.usage.today_at(now).as_dict(),
            "last_hour": track.usage.last_hour(now).as_dict(),
        }

    def host(self) -> dict[str, Any]:
        """Memory points of the last hour, oldest first. The first point may be older than an
        hour: it says what was held when the hour began."""
        since = self.clock() - WINDOW_MINUTES * MINUTE
        points = list(self._host)
        first = next((i for i, p in enumerate(points) if p.time > since), len(points))
        kept = points[max(0, first - 1) :]
        ids = {dep_id for p in kept for dep_id in p.held}
        return {
            "window_s": WINDOW_MINUTES * MINUTE,
            "points": [asdict(p) for p in kept],
            "names": {dep_id: self._names.get(dep_id, dep_id) for dep_id in sorted(ids)},
        }
