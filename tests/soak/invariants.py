"""The soak's verdict: its invariants as rows of a table, from what it recorded. Pure functions
of that record (no I/O), so tests/unit/test_soak_invariants.py can hold them to their meaning."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from chaos import Fault
from prometheus_client.parser import text_string_to_metric_families
from traffic import Outcome
from watch import ProcessSample

RSS_BOUND_MIB = 40.0  # growth of dgxmm's RSS over a run, median of its last third over its first
FD_BOUND = 25  # growth of its open files, the most in the last third over the most in the first
WARM_UP_S = 15.0  # the first seconds of a run (imports, first starts) are not its steady state


@dataclass(frozen=True)
class Row:
    name: str
    ok: bool | None  # None: reported, not judged
    value: str


def explain(outcomes: Iterable[Outcome], faults: Sequence[Fault]) -> tuple[Counter[str], list[Outcome]]:
    """Failed requests counted by the fault that explains them, and those no fault explains."""
    explained: Counter[str] = Counter()
    unexplained = []
    for out in outcomes:
        if not out.failed:
            continue
        cause = next((f.kind for f in faults if f.explains(out)), None)
        if cause is None:
            unexplained.append(out)
        else:
            explained[f"{cause}: {out.status or '-'} {out.code or out.kind}"] += 1
    return explained, unexplained


def steady_growth(samples: Sequence[ProcessSample]) -> tuple[float, int] | None:
    """RSS (MiB, medians) and open-file (maxima) growth from the first to the last third of the
    longest run, its warm-up left out; None without enough samples."""
    runs = Counter(s.run for s in samples)
    if not runs:
        return None
    run = max(runs, key=lambda r: runs[r])
    kept = [s for s in samples if s.run == run]
    kept = [s for s in kept if s.at - kept[0].at >= WARM_UP_S]
    if len(kept) < 9:
        return None
    third = len(kept) // 3
    first, last = kept[:third], kept[-third:]
    rss = statistics.median(s.rss_mib for s in last) - statistics.median(s.rss_mib for s in first)
    fds = max(s.fds for s in last) - max(s.fds for s in first)
    return rss, fds


def histogram(texts: Iterable[str], name: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets (upper bound, count), summed over its labels and over the
    scrapes given (one per dgxmm run: its counts start at zero)."""
    counts: Counter[float] = Counter()
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name + "_bucket":
                    counts[float(sample.labels["le"])] += sample.value
    return sorted(counts.items())


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram, read as Prometheus' histogram_quantile does
    (linear within the bucket); None when it is empty."""
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return lower


def cold_overheads(outcomes: Sequence[Outcome], able_at: dict[str, list[float]]) -> list[float]:
    """dgxmm's part of each cold start of a test engine: from the moment the engine could answer
    (the "able to answer at T" line it writes) to the first byte of the first streamed answer
    that waited for that start (a stream's first event comes at once from the test engine)."""
    found = []
    for dep, times in able_at.items():
        streams = [o for o in outcomes if o.deployment == dep and o.stream and o.first_byte_at is not None]
        for able in times:
            waited = [o.first_byte_at for o in streams if o.began_at <= able < o.first_byte_at]  # type: ignore[operator]
            if waited:
                found.append(min(waited) - able)
    return sorted(found)


def rows(
    outcomes: Sequence[Outcome],
    faults: Sequence[Fault],
    samples: Sequence[ProcessSample],
    *,
    leaked: dict[str, Any],
    busy_failures: list[str],
    lost_engines: list[str],
    orphans: list[str],
    metrics: list[str],
    skipped: list[str],
    able_at: dict[str, list[float]] | None = None,
) -> list[Row]:
    kinds = Counter(out.kind for out in outcomes)
    explained, unexplained = explain(outcomes, faults)
    fault_kinds = Counter(f.kind for f in faults)
    table = [
        Row("requests", None, f"{len(outcomes)}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))),
        Row("faults injected", None, ", ".join(f"{k} x{n}" for k, n in sorted(fault_kinds.items())) or "none"),
        Row(
            "no failure that a fault does not explain",
            not unexplained,
            f"{len(unexplained)} unexplained"
            + "".join(f"; {o.deployment} {o.status} {o.code or o.kind} {o.detail[:80]}" for o in unexplained[:5]),
        ),
        Row("failures by cause", None, ", ".join(f"{k} x{n}" for k, n in sorted(explained.items())) or "none"),
        Row(
            "no slot leaked (after the traffic: nothing in flight, queued or busy)",
            not leaked,
            "none" if not leaked else ", ".join(f"{k}={v}" for k, v in leaked.items()),
        ),
        Row(
            "no busy engine stopped (busy: health 8 s while it answers)",
            not busy_failures,
            "; ".join(busy_failures) or "never failed, never replaced but by the restart",
        ),
        Row(
            "no engine untracked",
            not lost_engines,
            "; ".join(lost_engines) or "every engine process had a running record",
        ),
        Row("no orphan (after the restart's shutdown and after the run)", not orphans, "; ".join(orphans) or "none"),
    ]
    growth = steady_growth(samples)
    if growth is None:
        table.append(Row("dgxmm's RSS and open files flat", False, "too few samples"))
    else:
        rss, fds = growth
        table.append(Row(f"dgxmm's RSS flat (within {RSS_BOUND_MIB:g} MiB)", rss <= RSS_BOUND_MIB, f"{rss:+.1f} MiB"))
        table.append(Row(f"dgxmm's open files flat (within {FD_BOUND})", fds <= FD_BOUND, f"{fds:+d}"))
    if samples:
        table.append(
            Row(
                "dgxmm's RSS, open files",
                None,
                f"{min(s.rss_mib for s in samples):.0f}-{max(s.rss_mib for s in samples):.0f} MiB, "
                f"{min(s.fds for s in samples)}-{max(s.fds for s in samples)} files",
            )
        )
    table.append(
        Row("p99 queue wait", None, _seconds(quantile(histogram(metrics, "dgxmm_ondemand_queue_wait_seconds"), 0.99)))
    )
    cold = histogram(metrics, "dgxmm_ondemand_cold_start_seconds")
    launch = histogram(metrics, "dgxmm_engine_launch_seconds")
    table.append(
        Row(
            "cold start, arrival to first byte, memory waits included (p50 / p99)",
            None,
            f"{_seconds(quantile(cold, 0.5))} / {_seconds(quantile(cold, 0.99))}",
        )
    )
    table.append(
        Row(
            "engine launch to ready (p50 / p99)",
            None,
            f"{_seconds(quantile(launch, 0.5))} / {_seconds(quantile(launch, 0.99))}",
        )
    )
    overheads = cold_overheads(outcomes, able_at or {})
    table.append(
        Row(
            "cold-start overhead: engine able to answer -> caller's first byte (p50 / max)",
            None,
            f"{_seconds(statistics.median(overheads))} / {_seconds(overheads[-1])} over {len(overheads)} starts"
            if overheads
            else "-",
        )
    )
    ttfb = sorted(o.ttfb for o in outcomes if o.kind == "ok" and o.ttfb is not None)
    if ttfb:
        table.append(
            Row(
                "callers' time to first byte (p50 / p99)",
                None,
                f"{_seconds(ttfb[len(ttfb) // 2])} / {_seconds(ttfb[int(len(ttfb) * 0.99)])}",
            )
        )
    if skipped:
        table.append(Row("faults skipped (nothing to do at the time)", None, "; ".join(skipped)))
    return table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def render(table: Sequence[Row]) -> str:
    lines = ["| invariant | holds | value |", "| --- | --- | --- |"]
    for row in table:
        verdict = "" if row.ok is None else ("yes" if row.ok else "**NO**")
        lines.append(f"| {row.name} | {verdict} | {row.value.replace('|', '/')} |")
    return "\n".join(lines)
