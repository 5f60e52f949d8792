"""Every metric dgxmm exports, defined once: name, type, labels, help and histogram buckets.

A family ``Metrics`` keeps (``kept=True``: the counters and histograms of things that happen) needs
nothing else: ``stats.DeploymentStats`` holds its series and ``collector.py`` renders it from this
declaration, so adding one is this entry plus the record call where the thing happens. The other
families are gauges the collector reads from the state's owner at scrape time.

Names follow Prometheus' conventions: the ``dgxmm_`` prefix, base units (seconds, bytes),
``_total`` for counters. Labels are bounded: ``deployment`` (the deployment's id) and
``served_name`` (the name clients call), and small fixed sets (route, status class, reason,
outcome, engine kind, state), and ``key``: the names of the caller keys an operator made (a few;
never a secret). Nothing is labelled per request or per peer. Requests the gateway
cannot tie to a known deployment (a bad path or key, an unknown id) carry ``deployment=""``.

docs/observability.md describes each metric; a unit test checks that it names all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEP = ("deployment", "served_name")

# Buckets, in seconds. A cold start is dominated by the engine's load (seconds to minutes); a
# request's first byte by the model's first token (tens of milliseconds up) unless it waited.
# Few buckets: every one is a series per deployment, rendered at every scrape.
FAST = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LONG = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
STARTS = (1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 300, 600, 1800)
WAITS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800)
LAGS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)  # the event loop's (looplag.py)
SPEEDS = (1, 2.5, 5, 10, 20, 30, 50, 75, 100, 150, 250, 500, 1000)  # tokens per second


# Labels a kept series takes from its deployment (``DeploymentStats.base``); they come first in a
# family's labels, the labels given with each record after them.
BASE_LABELS = ("deployment", "served_name", "engine")


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a dict key on the hot path
class Family:
    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    kept: bool = False  # Metrics keeps its series per deployment (else: a gauge read at scrape)
    zeros: tuple[tuple[str, ...], ...] = ((),)  # the series (record labels) that exist from the start
    unknown: bool = False  # also kept for requests tied to no deployment (``deployment=""``)

    @property
    def record_labels(self) -> tuple[str, ...]:
        """The labels given with each record: those after the deployment's own."""
        return tuple(label for label in self.labels if label not in BASE_LABELS)


# Refusal reasons: the gateway's error codes, shortened; any code not listed counts as "other".
REASONS = {
    "guard": "guard",
    "invalid_path": "path",
    "ondemand_not_configured": "not_configured",
    "rate_limited": "rate_limit",
    "invalid_api_key": "key",
    "request_too_large": "body",
    "not_found": "not_found",
    "not_on_demand": "not_on_demand",
    "ondemand_not_ready": "not_ready",
    "ondemand_health_unsupported": "health_unsupported",
    "ondemand_queue_full": "queue_full",
    "ondemand_queue_timeout": "queue_timeout",
    "does_not_fit": "does_not_fit",
    "start_failed": "start_failed",
    "ondemand_stopped": "stopped",
    "ondemand_cancelled": "cancelled",
    "ondemand_upstream_error": "upstream_error",
    "invalid_header": "header",
    "invalid_json": "json",
    "shutting_down": "shutting_down",
    "server_busy": "server_busy",
    "missing_model": "missing_model",
    "model_not_found": "model_not_found",
    "key_revoked": "ended",  # a caller key's request ended under way (gateway/inflight.py)
    "model_not_allowed": "ended",
    "request_ended": "ended",
}
OTHER_REASON = "other"
WAIT_OUTCOMES = ("granted", "refused", "gone")
STOP_REASONS = ("make_room", "drain", "idle", "unload")
START_OUTCOMES = ("ready", "failed")
LITELLM_OPERATIONS = ("add", "update", "delete")


# --- gateway ----------------------------------------------------------------------------------
REQUESTS = Family(
    "dgxmm_gateway_requests_total",
    "counter",
    "Requests through the on-demand gateway, by route and status class (499: the caller hung "
    "up before an answer began).",
    (*DEP, "route", "status_class"),
    kept=True,
    zeros=(),
    unknown=True,
)
REFUSALS = Family(
    "dgxmm_gateway_refusals_total",
    "counter",
    "Requests the gateway refused or failed itself (not the engine's own errors), by reason.",
    (*DEP, "reason"),
    kept=True,
    zeros=tuple((r,) for r in (*REASONS.values(), OTHER_REASON)),
    unknown=True,
)
FIRST_BYTE = Family(
    "dgxmm_gateway_time_to_first_byte_seconds",
    "histogram",
    "Arrival at the gateway to the first body byte sent back, for requests answered by the "
    "engine (a queued notice counts as the first byte).",
    DEP,
    FAST,
    kept=True,
    unknown=True,
)
DURATION = Family(
    "dgxmm_gateway_request_duration_seconds",
    "histogram",
    "Arrival at the gateway to the last byte of the answer, every request.",
    DEP,
    LONG,
    kept=True,
    unknown=True,
)
RESPONSE_BYTES = Family(
    "dgxmm_gateway_response_bytes_total",
    "counter",
    "Body bytes of engine answers passed back to callers.",
    DEP,
    kept=True,
    unknown=True,
)

TOKENS = Family(
    "dgxmm_tokens_total",
    "counter",
    "Tokens of the requests the engines answered, as their usage reports them: prompt and completion "
    "(answers without a usage count none), by the caller's key (its name; key-file: the on-demand key file).",
    (*DEP, "kind", "key"),
    kept=True,
    zeros=(("prompt", "key-file"), ("completion", "key-file")),
)
KEY_REQUESTS = Family(
    "dgxmm_gateway_key_requests_total",
    "counter",
    "Requests that showed a valid key, by the key's name (key-file: the on-demand key file) and status class.",
    (*DEP, "key", "status_class"),
    kept=True,
    zeros=(),
    unknown=True,
)
GENERATION_SPEED = Family(
    "dgxmm_generation_tokens_per_second",
    "histogram",
    "Generation speed of each answer that reported its completion tokens: the engine's own "
    "figure where it gives one (llama-server), else for a stream completion tokens from the "
    "engine's first byte to the last (no queue or cold start inside); an answer sent whole "
    "without the engine's figure is not observed.",
    DEP,
    SPEEDS,
    kept=True,
)

# --- on-demand controller ---------------------------------------------------------------------
INFLIGHT = Family("dgxmm_ondemand_inflight", "gauge", "Requests holding a slot.", DEP)
WAITING = Family(
    "dgxmm_ondemand_queued", "gauge", "Requests waiting for a slot: for a start, or queued for memory.", DEP
)
QUEUE_WAIT = Family(
    "dgxmm_ondemand_queue_wait_seconds",
    "histogram",
    "Time a request that got no slot at once waited for one (a start, or memory in the queue), "
    "from its arrival to the slot.",
    DEP,
    WAITS,
    kept=True,
)
WAITS_ENDED = Family(
    "dgxmm_ondemand_waits_total",
    "counter",
    "Requests that got no slot at once, by how their wait ended: granted, refused (an error) "
    "or gone (the caller hung up).",
    (*DEP, "outcome"),
    kept=True,
    zeros=tuple((o,) for o in WAIT_OUTCOMES),
)
QUEUED = Family(
    "dgxmm_ondemand_queued_requests_total",
    "counter",
    "Requests that had to queue for memory (the moment the queued notice would be sent).",
    DEP,
    kept=True,
)
COLD_START = Family(
    "dgxmm_ondemand_cold_start_seconds",
    "histogram",
    "Arrival to the first byte from the engine passed on, for requests that waited for their model to start or wake.",
    (*DEP, "engine"),
    STARTS,
    kept=True,
)
STARTS_FOR_REQUESTS = Family(
    "dgxmm_ondemand_starts_total",
    "counter",
    "Starts the controller made for waiting requests (wakes not counted).",
    DEP,
    kept=True,
)
WAKES = Family(
    "dgxmm_ondemand_wakes_total",
    "counter",
    "Wakes from sleep the controller made for waiting requests.",
    DEP,
    kept=True,
)
STOPS = Family(
    "dgxmm_ondemand_stops_total",
    "counter",
    "Approved on-demand stops, by reason: make_room (a victim for another model), drain (a busy "
    "model drained for a request that waited its turn), idle (the reaper) or unload (a caller's "
    "keep_alive 0 on the Ollama API).",
    (*DEP, "reason"),
    kept=True,
    zeros=tuple((r,) for r in STOP_REASONS),
)
START_FAILURES = Family(
    "dgxmm_ondemand_start_failures_total",
    "counter",
    "Starts or wakes for requests that failed (their waiters got start_failed).",
    DEP,
    kept=True,
)
BACKOFF = Family(
    "dgxmm_ondemand_backoff_remaining_seconds",
    "gauge",
    "Seconds new starts of a deployment are still refused after a failed start (0: none).",
    DEP,
)

# --- deployer and memory ----------------------------------------------------------------------
INFO = Family(
    "dgxmm_deployment_info",
    "gauge",
    "1 for each deployment, with its name, engine kind and mode.",
    (*DEP, "name", "engine", "mode"),
)
STATE = Family(
    "dgxmm_deployment_state", "gauge", "1 for the state each deployment is in, 0 for the others.", (*DEP, "state")
)
START_SECONDS = Family(
    "dgxmm_deployment_start_seconds",
    "histogram",
    "A start or wake (kind), from entering starting to ready or failed (outcome), the wait "
    "at the start-up gate included.",
    (*DEP, "engine", "kind", "outcome"),
    STARTS,
    kept=True,
    zeros=tuple(("start", o) for o in START_OUTCOMES),
)  # (wakes come with the first)
LAUNCH = Family(
    "dgxmm_engine_launch_seconds",
    "histogram",
    "The engine's launch (after the start-up gate) to ready: health answers and the model is "
    "listed. Successful starts only.",
    (*DEP, "engine"),
    STARTS,
    kept=True,
)
WATCHDOG = Family(
    "dgxmm_watchdog_failures_total",
    "counter",
    "Ready or asleep engines the watchdog found exited or not answering.",
    DEP,
    kept=True,
)
MEMORY_HELD_BY = Family(
    "dgxmm_deployment_memory_held_bytes",
    "gauge",
    "Declared memory a deployment holds now (starting, ready, asleep or stopping), else 0.",
    DEP,
)
MEMORY_MEASURED = Family(
    "dgxmm_deployment_memory_measured_bytes",
    "gauge",
    "Memory the deployment's engine holds, measured: its processes' proportional set size "
    "(or its container's memory) plus the GPU memory NVML reports for them. Absent while "
    "nothing runs.",
    DEP,
)
MEMORY_USABLE = Family("dgxmm_memory_usable_bytes", "gauge", "Memory deployments may use in all.")
MEMORY_CAPACITY = Family(
    "dgxmm_memory_capacity_bytes",
    "gauge",
    "What on-demand models can ever get: usable memory minus what always-on, system and decider deployments hold.",
)
MEMORY_HELD = Family("dgxmm_memory_held_bytes", "gauge", "Declared memory of every deployment holding memory.")
MEMORY_FREE = Family(
    "dgxmm_memory_free_bytes",
    "gauge",
    "Memory free for a start (with a measured source: also capped by what the machine reports available).",
)
DEVICE_MEMORY = Family(
    "dgxmm_device_memory_bytes",
    "gauge",
    "Each device's memory: its total, what deployments hold there, and what is free for a "
    "start (one device on a pooled host).",
    ("device", "kind"),
)

# --- engines (the metrics sampler) ------------------------------------------------------------
ENGINE_RUNNING = Family(
    "dgxmm_engine_requests_running", "gauge", "Requests the engine reports running, from its last metrics sample.", DEP
)
ENGINE_WAITING = Family(
    "dgxmm_engine_requests_waiting", "gauge", "Requests the engine reports waiting, from its last metrics sample.", DEP
)
ENGINE_SAMPLE_AGE = Family(
    "dgxmm_engine_sample_age_seconds",
    "gauge",
    "Age of the engine's last metrics sample (the controller trusts one under metrics_max_age_s).",
    DEP,
)

# --- LiteLLM sync -----------------------------------------------------------------------------
LITELLM_LAST_SUCCESS = Family(
    "dgxmm_litellm_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the last sync that finished without an error (0: none yet).",
)
LITELLM_READY = Family("dgxmm_litellm_ready", "gauge", "1 while the last sync succeeded.")
LITELLM_SYNCS = Family("dgxmm_litellm_syncs_total", "counter", "Syncs run.")
LITELLM_FAILURES = Family(
    "dgxmm_litellm_sync_failures_total",
    "counter",
    "Syncs that did not finish: LiteLLM unreachable, refused a call, or no master key.",
)
LITELLM_WRITES = Family(
    "dgxmm_litellm_entries_written_total",
    "counter",
    "Entry writes LiteLLM accepted, by operation (add, update, delete).",
    ("operation",),
)

# --- the service ------------------------------------------------------------------------------
PREFETCHED = Family(
    "dgxmm_prefetch_bytes_total",
    "counter",
    "Bytes of model files read into the page cache while their starts waited for room.",
)
LOOP_LAG = Family(
    "dgxmm_event_loop_lag_seconds",
    "histogram",
    "How late a 50 ms timer of dgxmm's event loop fired: what a request ready at that moment "
    "waited (a blocked loop, or a machine too busy to run dgxmm).",
    buckets=LAGS,
)
LOOP_LAG_CPU = Family(
    "dgxmm_event_loop_lag_cpu_seconds",
    "histogram",
    "The part of each lag of dgxmm_event_loop_lag_seconds its event loop spent computing, at least "
    "(its thread's CPU time over the tick less the 50 ms before it was due): the loop blocked by "
    "its own work, not waiting for a busy machine.",
    buckets=LAGS,
)
LOOP = (LOOP_LAG, LOOP_LAG_CPU)  # rendered by a collector of their own (a scrape of them alone costs nothing)
BUILD = Family("dgxmm_build_info", "gauge", "1, with dgxmm's version and instance id.", ("version", "instance"))

ALL = (
    REQUESTS,
    KEY_REQUESTS,
    REFUSALS,
    FIRST_BYTE,
    DURATION,
    RESPONSE_BYTES,
    TOKENS,
    GENERATION_SPEED,
    INFLIGHT,
    WAITING,
    QUEUE_WAIT,
    WAITS_ENDED,
    QUEUED,
    COLD_START,
    STARTS_FOR_REQUESTS,
    WAKES,
    STOPS,
    START_FAILURES,
    BACKOFF,
    INFO,
    STATE,
    START_SECONDS,
    LAUNCH,
    WATCHDOG,
    MEMORY_HELD_BY,
    MEMORY_MEASURED,
    MEMORY_USABLE,
    MEMORY_CAPACITY,
    MEMORY_HELD,
    MEMORY_FREE,
    DEVICE_MEMORY,
    ENGINE_RUNNING,
    ENGINE_WAITING,
    ENGINE_SAMPLE_AGE,
    LITELLM_LAST_SUCCESS,
    LITELLM_READY,
    LITELLM_SYNCS,
    LITELLM_FAILURES,
    LITELLM_WRITES,
    LOOP_LAG,
    LOOP_LAG_CPU,
    BUILD,
)
KEPT = tuple(family for family in ALL if family.kept)
